"""Local SGD: every rank trains on its own and the ranks average their weights every k steps."""
