"""Measurement: what a run did (its rows, per-link bytes, core use) and the machines it runs on (the
emulated cluster of shaped hosts, a SLURM on them)."""
