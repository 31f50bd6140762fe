"""Every benchmark behind BENCHMARKS.md, in one go (``make bench``).

    python benchmarks/run_all.py [--quick]

1. benchmarks/comm_bandwidth.py: gradient exchange (raw MPI, Horovod MPI/Gloo,
   PS gRPC push/pull) at the models' gradient sizes -> results/comm.json
2. benchmarks/throughput.py: training throughput and scaling efficiency with
   one core per worker, every backend -> results/throughput.json

Each script records its exact command in its result file; BENCHMARKS.md
quotes those. ``--quick`` runs fewer repeats and only the MLP and CNN, for a
smoke test of the harness (its figures are not the ones to quote).
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from common.base.errors import cli  # noqa: E402
from common.base.flags import Parser  # noqa: E402

from common.base.procs import REPO, child_env  # noqa: E402


@cli
def main():
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats, MLP and CNN only (smoke test)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="folder for the result files")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    quick_comm = ["--repeats", "3", "--warmup", "1", "--sizes_mb", "1"] if args.quick else []
    quick_tp = ["--models", "mlp,cnn", "--steps", "40"] if args.quick else []
    jobs = [
        [sys.executable, os.path.join(HERE, "comm_bandwidth.py"), *quick_comm,
         "--out", os.path.join(args.out, "comm.json")],
        [sys.executable, os.path.join(HERE, "throughput.py"), *quick_tp,
         "--out", os.path.join(args.out, "throughput.json")],
    ]
    for argv in jobs:
        print("==", " ".join(argv), flush=True)
        code = subprocess.call(argv, env=child_env(), cwd=REPO)
        if code != 0:
            print(f"error: {os.path.basename(argv[1])} exited with code {code}", file=sys.stderr)
            return code
    print(f"results in {args.out}; figures and commands: BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
