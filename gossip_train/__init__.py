"""Decentralized (gossip) SGD: each rank averages its weights with its ring neighbours every step."""
