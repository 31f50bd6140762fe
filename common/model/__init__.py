"""The model: building it, its train step, optimizer slots, evaluation, the compute probe, layer profiles."""
