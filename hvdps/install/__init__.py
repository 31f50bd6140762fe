"""Set-up: the TensorFlow stack a Python gets, and Horovod compiled against it (make setup)."""
