"""Rendering: the report's sections and verdict prose, its plots, and the styles every plot shares."""
