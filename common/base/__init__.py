"""Foundations every other part of common/ stands on: one error line, files written whole, one flag parser, processes."""
