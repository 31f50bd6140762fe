"""A trainer's life cycle: the Backend interface, the bookkeeper, the run folder, checkpoints, the run log and metrics, the watchdog."""
