"""What the all-reduce methods share (Horovod, bare MPI, local SGD, TensorFlow's MultiWorkerMirrored):
the backend interface, the training loop, the mpi4py job and the roster of MPI-launched ranks."""
