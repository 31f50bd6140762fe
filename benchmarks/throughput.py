"""Training throughput and scaling efficiency with an equal core budget per worker.

    python benchmarks/throughput.py [--models mlp,cnn,resnet50] [--backends horovod,ps:async,ps:sync]

Each worker gets exactly one core: the 1-worker baseline is pinned to core 0,
2 workers to cores 0 and 1 (Horovod: ``mpirun -bind-to core -map-by core``;
PS: the launcher's ``--pin_workers``), each with one TF thread. PS tasks are not
pinned; their CPU seconds are reported as part of the cost. Synthetic data,
warm-up steps excluded; samples/sec is the median over logging intervals, with
the mean +/- 95% half-width. Efficiency = throughput(2) / (2 * throughput(1)).
Results: benchmarks/results/throughput.json and a markdown table.
"""
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
from common.base.errors import cli  # noqa: E402
from common.base.flags import Parser  # noqa: E402

from hvdps.measure.rows import load_run  # noqa: E402
from common.base.procs import child_env  # noqa: E402
from common.formats.schemas import read_launch_record  # noqa: E402
from hvdps.methods import add_task_flags, get_launcher  # noqa: E402

MODELS = {   # synthetic data shape, classes, per-worker batch, steps (global-batch steps), warm-up
    "mlp": (["--image_shape", "28,28,1", "--num_classes", "10"], 64, 400, 20),
    "cnn": (["--image_shape", "28,28,1", "--num_classes", "10"], 32, 120, 10),
    "resnet50": (["--image_shape", "64,64,3", "--num_classes", "100"], 8, 24, 4),
}


def command(backend, mode, workers, tasks, model, out, batch=None, steps=None, warm=None, mpi_yield=False):
    """The comparison's own launch line (hvdps.launchers), pinned to one core per worker."""
    shape, batch0, steps0, warm0 = MODELS[model]
    batch, steps, warm = batch or batch0, steps or steps0, warm or warm0
    flags = ["--model", model, "--dataset", "synthetic", *shape, "--batch_size", str(batch),
             "--train_steps", str(steps), "--warmup_steps", str(warm), "--log_every", "2",
             "--synthetic_samples", "512", "--eval_every_epoch", "false", "--checkpoint_every_epoch", "false",
             "--train_dir", out]
    launcher = get_launcher(backend, mpi_yield=mpi_yield)
    return launcher.command(workers, flags, mode=mode, tasks=tasks, pin_cores=True), launcher.env()


@cli
def main():
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,cnn,resnet50")
    ap.add_argument("--backends", default="horovod:sync,ps:async,ps:sync")
    add_task_flags(ap)                  # the methods' own, as hvdps compare takes them (--num_ps 1,2)
    ap.add_argument("--batch", type=int, default=None, help="per-worker batch for every model (default: per model)")
    ap.add_argument("--steps", type=int, default=None, help="global-batch steps per run")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps excluded from throughput")
    ap.add_argument("--mpi_yield", action="store_true", help="mpirun --mca mpi_yield_when_idle 1 for Horovod")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "throughput.json"))
    args = ap.parse_args()
    env = child_env()
    rows = []
    tmp = tempfile.mkdtemp(prefix="hvdps-bench-")
    try:
        for model in args.models.split(","):
            for variant in args.backends.split(","):
                backend, _, mode = variant.partition(":")
                for tasks in get_launcher(backend).task_choices(args):
                    num_ps = sum(n for _, n in tasks)                # the results' key: 0 for workers only
                    for workers in (1, 2):
                        out = os.path.join(tmp, f"{model}-{backend}-{mode}-ps{num_ps}-w{workers}")
                        argv, extra_env = command(backend, mode or "sync", workers, tasks, model, out, args.batch,
                                       args.steps, args.warmup, args.mpi_yield)
                        p = subprocess.run(argv, capture_output=True, text=True, env={**env, **extra_env}, cwd=REPO,
                                           timeout=1800)
                        row = {"model": model, "backend": backend, "mode": mode or "sync", "num_ps": num_ps,
                               "workers": workers, "command": shlex.join(argv).replace(tmp, "$OUT"),
                               "ok": p.returncode == 0}
                        if p.returncode == 0:
                            r = load_run(out)
                            row.update(median=r.samples_per_sec_median, mean=r.samples_per_sec_mean,
                                       error=r.samples_per_sec_error, grad_bytes=r.grad_bytes_per_step,
                                       step_ms=_ms(r.step_s), compute_ms=_ms(r.compute_s),
                                       exchange_ms=_ms(r.exchange_s))
                            launch = os.path.join(out, "launch.json")
                            if os.path.exists(launch):
                                row["cpu_seconds"] = read_launch_record(launch).cpu_seconds
                        else:
                            row["error"] = (p.stderr or p.stdout)[-500:]
                        rows.append(row)
                        print(json.dumps({k: v for k, v in row.items() if k != "command"}), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = {(r["model"], r["backend"], r["mode"], r["num_ps"]): r.get("median") for r in rows if r["workers"] == 1}
    for r in rows:
        b = base.get((r["model"], r["backend"], r["mode"], r["num_ps"]))
        r["efficiency"] = r["median"] / (r["workers"] * b) if b and r.get("median") else None
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"command": shlex.join([os.path.relpath(sys.executable, REPO)] + sys.argv), "rows": rows}, f,
                  indent=2)
    print(table(rows))


def _ms(seconds):
    return None if seconds is None else round(1000 * seconds, 3)


def table(rows):
    lines = ["| model | backend | mode | PS | workers | samples/sec median | mean ± 95% | efficiency | "
             "step = compute + overhead (ms) | PS cpu s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = f"| {r['model']} | {r['backend']} | {r['mode']} | {r['num_ps'] or '-'} | {r['workers']} | "
        if not r.get("median"):
            lines.append(head + "failed | | | | |")
            continue
        eff = "-" if r.get("efficiency") is None else f"{100 * r['efficiency']:.0f}%"
        ps_cpu = sum(v for k, v in (r.get("cpu_seconds") or {}).items() if k.startswith("ps:"))
        split = (f"{r['step_ms']:.2f} = {r['compute_ms']:.2f} + {r['step_ms'] - r['compute_ms']:.2f}"
                 if r.get("step_ms") is not None and r.get("compute_ms") is not None else "-")
        if r.get("exchange_ms") is not None:
            split += f" (MPI_Allreduce {r['exchange_ms']:.2f})"
        spread = "(one interval)" if r.get("error") is None else f"± {r['error']:.1f}"
        lines.append(head + f"{r['median']:.1f} | {r['mean']:.1f} {spread} | {eff} | {split} | "
                     f"{ps_cpu:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
