"""TensorFlow's MultiWorkerMirroredStrategy trainer: synchronous data parallelism with TF's own all-reduce.

One task per worker, each told the cluster by TF_CONFIG (as Kubeflow's TFJob sets it) or by flags:

    hvdps launch mwms --num_workers 2 --model cnn        # every worker on this machine
    TF_CONFIG='{"cluster":{"worker":["h1:2222","h2:2222"]},"task":{"type":"worker","index":0}}' \\
        python mwms_train/main.py --model cnn                      # and index 1 on h2
    python mwms_train/main.py --worker_hosts h1:2222,h2:2222 --task_index 0 --model cnn
    python mwms_train/main.py                                      # one process on its own

Lines marked ``# MWMS:`` are the only differences from single-process code; the loop,
bookkeeping, checkpoints and metrics are the Horovod trainer's (allreduce/sync_loop.py).
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # keep TF's C++ start-up chatter out of the logs
if __package__ in (None, ""):   # run as a script: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.spec.config import build_parser, from_args
from common.inputs.data import num_examples
from common.base.errors import cli
from allreduce.sync_loop import train_allreduce
from common.trainer.run_dir import check_resume_compatible, check_train_dir
from mwms_train.backend import MWMSBackend, add_mwms_args, listen_on_own_address, resolve_workers


def make_parser():
    return add_mwms_args(build_parser(__doc__.splitlines()[0], prog="mwms_train/main.py"))


@cli(hard_exit=True)      # a failed task exits at once: TensorFlow's gRPC server cannot be stopped
def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)
    cfg = from_args(args)
    cluster, index = resolve_workers(args, os.environ)    # MWMS: the cluster from flags or TF_CONFIG
    if index != 0:
        os.environ["HVDPS_QUIET_ERRORS"] = "1"              # MWMS: one error line per job, from worker 0
    check_train_dir(cfg)
    if cfg.resume:
        check_resume_compatible(cfg, cfg.train_dir)
    num_train = num_examples(cfg)

    # MWMS: this task's gRPC server on its own address only (may re-execute this process), then
    # the strategy: threads, the collective's implementation, pack size and timeout.
    backend = MWMSBackend(cluster, index, implementation=args.implementation, pack_size_mb=args.pack_size_mb,
                          step_timeout=args.step_timeout, startup_timeout=args.startup_timeout)
    listen_on_own_address(backend.address, args.bind, f"worker:{index}")
    backend.setup(cfg)

    # MWMS: variables made in the strategy's scope, each step through strategy.run, the gradients
    # summed by its all-reduce in apply_gradients: allreduce/sync_loop.py, as the Horovod trainer.
    return train_allreduce(cfg, backend, num_train, extra_header={"implementation": args.implementation},
                           timeouts=(args.step_timeout, args.startup_timeout))   # MWMS: its input bounded too


if __name__ == "__main__":
    sys.exit(main())
