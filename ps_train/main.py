"""Parameter-server trainer on TensorFlow's gRPC runtime (between-graph replication).

Launch one process per role, the way the classic distributed-TF examples do:

    python ps_train/main.py --job_name=ps     --task_index=0 --ps_hosts=h1:2222 --worker_hosts=h2:2222,h3:2222
    python ps_train/main.py --job_name=worker --task_index=0 --ps_hosts=h1:2222 --worker_hosts=h2:2222,h3:2222
    python ps_train/main.py --job_name=worker --task_index=1 --ps_hosts=h1:2222 --worker_hosts=h2:2222,h3:2222 --sync

or with Kubeflow's TF_CONFIG instead of the host flags (the chief, if listed, trains too):

    TF_CONFIG='{"cluster":{"chief":["c:2222"],"ps":["p:2222"],"worker":["w:2222"]},
                "task":{"type":"worker","index":0}}' python ps_train/main.py

or all roles on this machine with free ports:

    hvdps launch ps --num_ps 2 --num_workers 2 [--sync] [trainer flags]

``--ps_api v2`` runs the same job on TensorFlow 2's ParameterServerStrategy
instead (a chief that coordinates; see ps_train/v2.py for its launch lines).

Worker 0 (or the chief) initialises the variables, evaluates, and writes
checkpoints, TensorBoard events and metrics.jsonl; at the end it tells every PS
to exit (ps_train/stop.py). Lines marked ``# PS:`` are the only differences
from single-process code.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # keep TF's C++ start-up chatter out of the logs
if __package__ in (None, ""):   # run as a script: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.spec.config import build_parser, from_args
from common.base.errors import cli
from ps_train import classic, v2
from ps_train.cluster import add_ps_args, resolve_cluster


def make_parser():
    return add_ps_args(build_parser(__doc__.splitlines()[0], prog="ps_train/main.py"))


@cli(hard_exit=True)
def main(argv=None):
    args = make_parser().parse_args(argv)
    cfg = from_args(args)
    cluster, job, index = resolve_cluster(args)  # PS: flags, --cluster_spec or TF_CONFIG
    api = v2 if args.ps_api == "v2" else classic  # PS: TF2's ParameterServerStrategy, or the between-graph job
    return api.run(args, cfg, cluster, job, index, restrict=argv is None)


if __name__ == "__main__":
    sys.exit(main())
