"""The all-reduce trainers against the bare-MPI reference, inside the same training loop.

    python benchmarks/allreduce_loop.py [--backends mpi,horovod,mwms] [--variants default,yield,...] [--repeats 3]

Every trainer runs ``allreduce/sync_loop.py`` with the same model, batch, data and
threads; only the gradient exchange differs (Horovod's DistributedGradientTape,
TensorFlow's MultiWorkerMirroredStrategy's collective all-reduce in
apply_gradients, or one mpi4py ``Allreduce`` on one fused buffer). Each repeat
runs, for every variant, the first backend's job (bare MPI) and then the others'
right after it, so each ratio compares runs of the same minute on this noisy
machine; the figure quoted is the median of those pairwise ratios. A variant is
a set of Open MPI parameters, Horovod environment variables and trainer flags
(Open MPI's apply to the mpirun-launched jobs, Horovod's to the Horovod job).

Result: results/allreduce_loop.json with the exact commands.
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from common.base.errors import cli  # noqa: E402
from common.base.flags import Parser  # noqa: E402

from hvdps.measure.rows import load_run  # noqa: E402
from common.base.procs import child_env  # noqa: E402
from hvdps.methods import get_launcher  # noqa: E402
from results_file import save  # noqa: E402

YIELD = ("--mca", "mpi_yield_when_idle", "1")
SPIN = ("--mca", "mpi_yield_when_idle", "0")       # Open MPI's own default, before the trainers yield
GROUP1 = ("--num_groups", "1")
# name -> (mpirun parameters, environment, one core per rank, Horovod trainer flags)
VARIANTS = {
    "default": ((), {}, False, ()),
    "spin": (SPIN, {}, False, ()),
    "yield": (YIELD, {}, False, ()),
    "cycle0": ((), {"HOROVOD_CYCLE_TIME": "0"}, False, ()),
    "cycle5": ((), {"HOROVOD_CYCLE_TIME": "5"}, False, ()),
    "yield+cycle5": (YIELD, {"HOROVOD_CYCLE_TIME": "5"}, False, ()),
    "mpi_threads_disable": ((), {"HOROVOD_MPI_THREADS_DISABLE": "1"}, False, ()),
    "groups1": ((), {}, False, GROUP1),
    "groups1+cycle0": ((), {"HOROVOD_CYCLE_TIME": "0"}, False, GROUP1),
    "groups1+yield": (YIELD, {}, False, GROUP1),
    "pinned": ((), {}, True, ()),
    "pinned+yield": (YIELD, {}, True, ()),
    "pinned+spin": (SPIN, {}, True, ()),
    "pinned+groups1": ((), {}, True, GROUP1),
}


def run_job(backend, variant, args, out_dir):
    mca, env_extra, pin, hvd_flags = VARIANTS[variant]
    trainer = [*(hvd_flags if backend == "horovod" else ()),
               "--model", args.model, "--batch_size", str(args.batch_size), "--train_steps", str(args.steps),
               "--log_every", "10", "--eval_every_epoch", "false", "--checkpoint_every_epoch", "false",
               "--train_dir", out_dir, *args.trainer_args.split()]
    launcher = get_launcher(backend)
    argv = launcher.command(args.workers, trainer, pin_cores=pin)
    if "-x" in argv:                  # an mpirun line: the variant's Open MPI parameters go before -x
        at = argv.index("-x")
        argv = argv[:at] + list(mca) + argv[at:]
    env = child_env()
    env.update(launcher.env())
    env.update(env_extra)
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=args.timeout)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"error: {backend} {variant} failed ({proc.returncode}):\n{proc.stdout[-2000:]}")
    row = load_run(out_dir)
    return {"samples_per_sec": row.samples_per_sec_median, "step_ms": 1e3 * (row.step_s or 0),
            "compute_ms": 1e3 * (row.compute_s or 0), "overhead_ms": 1e3 * (row.overhead_s or 0),
            "exchange_ms": 1e3 * row.exchange_s if row.exchange_s else None,
            "wall_s": wall, "command": " ".join(argv), "env": env_extra}


@cli
def main():
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="default,yield,cycle5,yield+cycle5",
                    help=f"comma-separated, from: {', '.join(VARIANTS)}")
    ap.add_argument("--backends", default="mpi,horovod",
                    help="all-reduce backends, the first the reference the others' ratios are taken against")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--batch_size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--trainer_args", default="", help="more trainer flags, e.g. '--probe_steps 0'")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "allreduce_loop.json"))
    args = ap.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"error: unknown variant(s) {', '.join(unknown)} (valid: {', '.join(VARIANTS)})")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    runs = {v: {b: [] for b in backends} for v in variants}
    scratch = tempfile.mkdtemp(prefix="allreduce_loop.")
    try:
        for rep in range(args.repeats):
            for v in variants:
                for backend in backends:
                    out_dir = os.path.join(scratch, f"{v}-{backend}-{rep}")
                    r = run_job(backend, v, args, out_dir)
                    runs[v][backend].append(r)
                    print(f"rep {rep} {v:>20} {backend:>8}: {r['samples_per_sec']:9.0f} samples/s  step "
                          f"{r['step_ms']:.2f} = {r['compute_ms']:.2f} + {r['overhead_ms']:.2f} ms", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    table = {}
    med = lambda rs, k: statistics.median(r[k] for r in rs)      # noqa: E731
    ref = backends[0]
    for v in variants:
        table[v] = {}
        for b in backends:
            table[v][f"{b}_samples_per_sec"] = med(runs[v][b], "samples_per_sec")
            table[v][f"{b}_step_ms"] = med(runs[v][b], "step_ms")
            table[v][f"{b}_compute_ms"] = med(runs[v][b], "compute_ms")
            if b != ref:
                ratios = [y["samples_per_sec"] / x["samples_per_sec"] for x, y in zip(runs[v][ref], runs[v][b])]
                table[v][f"{b}_ratio_median"], table[v][f"{b}_ratios"] = statistics.median(ratios), ratios
        t = table[v]
        print(f"{v:>20}: " + "  ".join(f"{b} {t[f'{b}_samples_per_sec']:8.0f}" for b in backends) + "  " +
              "  ".join(f"{b}/{ref} {t[f'{b}_ratio_median']:.2f}x (pairs "
                        f"{', '.join(f'{r:.2f}' for r in t[f'{b}_ratios'])})" for b in backends[1:]))
    save(args.out, args, table=table, runs=runs)


if __name__ == "__main__":
    main()
