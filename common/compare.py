"""hvdps-compare: run Horovod and parameter servers on one config and report side by side.

    hvdps-compare --workers 1,2 --backends horovod,ps --out runs/compare [trainer flags]
    hvdps-compare --from runs/compare              # rebuild the report, no training
    hvdps-compare --dry-run --workers 1,2,4         # print the exact commands

Every run goes through the real launcher (horovodrun, python -m ps_train.launch)
with identical trainer flags, so model, data, seed, per-worker batch, global
batch, learning-rate rule and samples seen are the same; only the distribution
differs. A failed run is recorded with its error and the others still run.
"""
import csv
import json
import os
import shlex
import subprocess
import sys
import time

from common.backend import backend_class
from common.config import build_parser, from_args
from common.errors import UsageError, cli
from common.metrics import format_throughput, load_run, read_records

COLUMNS = ("backend", "mode", "workers", "num_ps", "status", "samples_per_sec_median",
           "samples_per_sec_mean", "samples_per_sec_error", "scaling_efficiency", "time_to_target",
           "final_test_accuracy", "final_test_loss", "grad_bytes_per_step", "wall_time",
           "global_batch", "oversubscribed", "error", "run_dir")


def parse_variants(text):
    """'horovod,ps' -> [(backend, mode)], PS in both modes; 'ps:sync' picks one mode."""
    out = []
    for item in [s.strip() for s in text.split(",") if s.strip()]:
        name, _, mode = item.partition(":")
        cls = backend_class(name)                 # unknown names list the valid ones
        modes = cls.modes()
        if mode and mode not in modes:
            raise UsageError(f"backend {name} has no mode '{mode}' (valid: {', '.join(modes)})")
        out += [(name, m) for m in ([mode] if mode else modes)]
    if not out:
        raise UsageError("--backends is empty")
    return out


def parse_workers(text):
    try:
        counts = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--workers expects numbers like 1,2,4, got {text!r}")
    if not counts or counts[0] < 1:
        raise UsageError(f"--workers expects positive numbers, got {text!r}")
    return counts


def plan_runs(args, trainer_args, cores):
    runs = []
    python = sys.executable
    for backend, mode in parse_variants(args.backends):
        cls = backend_class(backend)
        servers = cls.server_tasks(args.num_ps)
        for n in parse_workers(args.workers):
            name = f"{backend}-{mode}-w{n}" + (f"-ps{servers}" if servers else "")
            run_dir = os.path.join(args.out, "runs", name)
            cmd = cls.launch_command(n, [*trainer_args, "--train_dir", run_dir], python, mode=mode,
                                     num_ps=args.num_ps)
            procs = n + servers
            runs.append({"name": name, "backend": backend, "mode": mode, "workers": n, "run_dir": run_dir,
                         "cmd": cmd, "oversubscribed": procs > cores})
    return runs


def _last_error(log_path):
    try:
        lines = open(log_path, errors="replace").read().splitlines()
    except OSError:
        return None
    errors = [l[l.index("error:"):] for l in lines if "error:" in l]
    return errors[-1] if errors else (lines[-1][-300:] if lines else None)


def execute(runs, timeout, progress=True):
    """Run each job in turn; a failure is recorded, never fatal."""
    from tqdm import tqdm
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    bar = tqdm(runs, desc="runs", unit="run", disable=None if progress else True,  # None: off when not a TTY
               dynamic_ncols=True)
    for run in bar:
        bar.set_postfix_str(run["name"])
        os.makedirs(os.path.dirname(run["run_dir"]), exist_ok=True)
        if os.path.exists(os.path.join(run["run_dir"], "metrics.jsonl")):
            raise UsageError(f"{run['run_dir']} already holds a run; choose another --out")
        log_path = run["run_dir"] + ".log"
        started = time.monotonic()
        with open(log_path, "w") as log:
            p = subprocess.Popen(run["cmd"], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=repo,
                                 start_new_session=True)
            code = _wait(p, run, timeout, bar)
        run.update(returncode=code, seconds=time.monotonic() - started, log=log_path)
        if code != 0:
            run["error"] = _last_error(log_path) or f"exit code {code}"
            bar.write(f"{run['name']}: FAILED ({run['error']})")
        else:
            bar.write(f"{run['name']}: ok in {run['seconds']:.0f}s")
    bar.close()
    return runs


def _wait(p, run, timeout, bar):
    """Wait for one job, showing its progress from the metrics file as it grows."""
    import signal
    deadline = time.monotonic() + timeout
    metrics = os.path.join(run["run_dir"], "metrics.jsonl")
    while True:
        try:
            return p.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        if os.path.exists(metrics):
            recs = read_records(metrics)
            head = next((r for r in recs if r["type"] == "header"), None)
            last = next((r for r in reversed(recs) if r["type"] == "step"), None)
            if head and last:
                bar.set_postfix_str(f"{run['name']} step {last['global_step']}/{head.get('total_steps')}")
        if time.monotonic() > deadline:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            return 124


# ------------------------------------------------------------------ report
def collect(runs):
    rows = []
    for run in runs:
        if os.path.exists(os.path.join(run["run_dir"], "metrics.jsonl")):
            row, curves = load_run(run["run_dir"])
        else:
            row, curves = {"backend": run["backend"], "mode": run["mode"], "workers": run["workers"],
                           "status": "failed", "run_dir": run["run_dir"]}, {}
        row.setdefault("backend", run["backend"])
        row["backend"], row["mode"], row["workers"] = run["backend"], run["mode"], run["workers"]
        if run.get("returncode") not in (None, 0):
            row["status"] = "failed"
        row["error"] = run.get("error")
        row["oversubscribed"] = run.get("oversubscribed", False)
        row["_curves"] = curves
        rows.append(row)
    add_scaling(rows)
    return rows


def add_scaling(rows):
    """Efficiency = throughput(n) / (n * throughput(1)) within the same backend and mode."""
    base = {(r["backend"], r["mode"]): r.get("samples_per_sec_median")
            for r in rows if r["workers"] == 1 and r.get("status") == "ok"}
    for r in rows:
        b, t = base.get((r["backend"], r["mode"])), r.get("samples_per_sec_median")
        r["scaling_efficiency"] = (t / (r["workers"] * b)) if b and t and r.get("status") == "ok" else None


def _fmt(v, digits=3):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def write_report(rows, out, cfg_dict, environment):
    os.makedirs(out, exist_ok=True)
    plain = [{k: r.get(k) for k in COLUMNS} for r in rows]
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"rows": plain, "config": cfg_dict, "environment": environment}, f, indent=2)
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(plain)
    plots = write_plots(rows, out)
    lines = ["# hvdps comparison", "",
             "| backend | mode | workers | PS | samples/sec (median) | mean ± 95% | scaling eff. | "
             "time to target (s) | test acc. | test loss | grad bytes/step/worker | wall (s) | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tp = (f"{r['samples_per_sec_mean']:.0f} ± {r['samples_per_sec_error']:.0f}"
              if r.get("samples_per_sec_mean") is not None else "-")
        eff = f"{100 * r['scaling_efficiency']:.0f}%" if r.get("scaling_efficiency") is not None else "-"
        status = r.get("status") or "-"
        if r.get("oversubscribed"):
            status += " (oversubscribed)"
        if r.get("error"):
            status += f": {r['error']}"
        lines.append(f"| {r['backend']} | {r['mode']} | {r['workers']} | {r.get('num_ps') or '-'} | "
                     f"{_fmt(r.get('samples_per_sec_median'))} | {tp} | {eff} | {_fmt(r.get('time_to_target'))} | "
                     f"{_fmt(r.get('final_test_accuracy'))} | {_fmt(r.get('final_test_loss'))} | "
                     f"{_fmt(r.get('grad_bytes_per_step'))} | {_fmt(r.get('wall_time'))} | {status} |")
    lines += ["", "Throughput excludes the first `--warmup_steps` steps; ± is the 95% half-width over "
              "logging intervals. Scaling efficiency = throughput(n) / (n × throughput(1)) for the same "
              "backend and mode. A run is *oversubscribed* when it starts more processes than this "
              "machine has cores: its scaling figures measure contention, not the method.", "",
              "## Environment", ""]
    lines += [f"- {k}: {v}" for k, v in environment.items()]
    lines += ["", "## Config", "", "```json", json.dumps(cfg_dict, indent=2, sort_keys=True), "```", ""]
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines))
    return "\n".join(lines[:len(rows) + 4])


def write_plots(rows, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    written = []
    series = {}
    for r in rows:
        series.setdefault(f"{r['backend']} {r['mode']}", []).append(r)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for label, rs in series.items():
        rs = sorted((r for r in rs if r.get("samples_per_sec_median")), key=lambda r: r["workers"])
        if rs:
            ax1.plot([r["workers"] for r in rs], [r["samples_per_sec_median"] for r in rs], "o-", label=label)
            eff = [(r["workers"], r["scaling_efficiency"]) for r in rs if r.get("scaling_efficiency") is not None]
            if eff:
                ax2.plot(*zip(*eff), "o-", label=label)
    ax1.set(xlabel="workers", ylabel="samples/sec (median)", title="Throughput")
    ax2.set(xlabel="workers", ylabel="efficiency", title="Scaling efficiency", ylim=(0, 1.2))
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "throughput.png"), dpi=100)
    plt.close(fig)
    written.append("throughput.png")

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for r in rows:
        evals = (r.get("_curves") or {}).get("evals") or []
        if evals:
            label = f"{r['backend']} {r['mode']} w{r['workers']}"
            ax1.plot([e["wall_time"] for e in evals], [e["accuracy"] for e in evals], "o-", label=label)
            ax2.plot([e["wall_time"] for e in evals], [e["loss"] for e in evals], "o-", label=label)
    ax1.set(xlabel="wall-clock seconds", ylabel="test accuracy", title="Accuracy vs time")
    ax2.set(xlabel="wall-clock seconds", ylabel="test loss", title="Loss vs time")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "accuracy_vs_time.png"), dpi=100)
    plt.close(fig)
    written.append("accuracy_vs_time.png")
    return written


def environment_of(rows):
    import platform
    header = next(((r.get("_curves") or {}).get("header") for r in rows if (r.get("_curves") or {}).get("header")), {})
    env = {"host": header.get("host", platform.node()), "cores": os.cpu_count()}
    env.update({k: v for k, v in (header.get("versions") or {}).items()})
    return env


def runs_from_dirs(dirs):
    """Runs found below the given directories (each holding metrics.jsonl, or runs/*)."""
    runs = []
    for d in dirs:
        if not os.path.isdir(d):
            raise UsageError(f"--from {d}: no such directory")
        candidates = [d] if os.path.exists(os.path.join(d, "metrics.jsonl")) else \
            sorted(os.path.join(root, "") [:-1] for root, _, files in os.walk(d) if "metrics.jsonl" in files)
        for c in candidates:
            header = next((r for r in read_records(os.path.join(c, "metrics.jsonl")) if r["type"] == "header"), None)
            if header:
                runs.append({"backend": header["backend"], "mode": header["mode"],
                             "workers": header["world_size"], "run_dir": c, "returncode": None})
    if not runs:
        raise UsageError(f"--from: no runs (metrics.jsonl) found in {', '.join(dirs)}")
    return sorted(runs, key=lambda r: (r["backend"], r["mode"], r["workers"]))


def make_parser():
    p = build_parser(__doc__.splitlines()[0], prog="hvdps-compare")
    g = p.add_argument_group("comparison")
    g.add_argument("--workers", default="1,2", help="worker counts, e.g. 1,2,4")
    g.add_argument("--backends", default="horovod,ps", help="horovod, ps (both modes), ps:async, ps:sync")
    g.add_argument("--num_ps", type=int, default=1, help="parameter-server tasks for PS runs")
    g.add_argument("--run_timeout", type=float, default=900, help="seconds before a run is stopped")
    g.add_argument("--dry-run", dest="dry_run", action="store_true", help="print the commands, run nothing")
    g.add_argument("--from", dest="from_dirs", nargs="+", default=None,
                   help="rebuild the report from existing run directories")
    g.add_argument("--no-progress", dest="progress", action="store_false")
    j = p.add_argument_group("scaling projection (--project)")
    j.add_argument("--project", action="store_true", help="project efficiency to many workers; no training")
    j.add_argument("--comm-json", dest="comm_json", default=None,
                   help="measured latency/bandwidth (benchmarks/results/comm.json) to fit the model from")
    j.add_argument("--bandwidth-gbps", dest="bandwidth_gbps", type=float, default=None,
                   help="link bandwidth in Gbit/s (overrides the measured fit)")
    j.add_argument("--latency-us", dest="latency_us", type=float, default=None, help="per-message latency")
    j.add_argument("--step-compute-ms", dest="step_compute_ms", type=float, default=None,
                   help="compute time of one step on one worker")
    j.add_argument("--model-params", dest="model_params", type=float, default=None,
                   help="parameters (millions) of the model whose gradients are exchanged")
    j.add_argument("--model-name", dest="model_name", default=None,
                   help="known model for --model-params: resnet50, resnet101, inception_v3, vgg16")
    j.add_argument("--gpus-per-server", dest="gpus_per_server", type=int, default=1)
    j.add_argument("--overlap", type=float, default=0.0,
                   help="fraction of communication hidden behind backprop (0 = none)")
    j.add_argument("--max-workers", dest="max_workers", type=int, default=512)
    j.add_argument("--compute-from", dest="compute_from", default=None,
                   help="a 1-worker run dir: compute time per step = batch / its samples/sec")
    p.set_defaults(train_dir="runs/compare")
    return p


def run_projection(args):
    """The alpha-beta projection (common.projection) from measurements and/or given hardware."""
    from common import projection as pj
    fits = {}
    comm_json = args.comm_json or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                               "benchmarks", "results", "comm.json")
    for name in ("bandwidth_gbps", "latency_us", "step_compute_ms", "model_params"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.comm_json and not os.path.exists(args.comm_json):
        raise UsageError(f"--comm-json {args.comm_json}: no such file")
    if os.path.exists(comm_json) and (args.bandwidth_gbps is None or args.latency_us is None):
        try:
            data = json.load(open(comm_json))
            fits = pj.fit_from_comm(data["results"], data.get("np", 2))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"--comm-json {comm_json}: not a comm_bandwidth.py result file ({exc})")
    ring, ps = fits.get("allreduce"), fits.get("ps")
    if args.bandwidth_gbps is not None or args.latency_us is not None:
        if args.bandwidth_gbps is None or args.latency_us is None:
            if not ring:
                raise UsageError("--project needs both --bandwidth-gbps and --latency-us, or a --comm-json")
        bw = args.bandwidth_gbps * 1e9 / 8 if args.bandwidth_gbps is not None else ring["bandwidth"]
        lat = args.latency_us * 1e-6 if args.latency_us is not None else ring["alpha"]
        ring = ps = {"bandwidth": bw, "alpha": lat}
    if not ring or not ps:
        raise UsageError(f"--project: no measurements at {comm_json} (run benchmarks/comm_bandwidth.py) "
                         f"and no --bandwidth-gbps/--latency-us given")
    if args.model_name and args.model_name not in pj.KNOWN_MODELS:
        raise UsageError(f"unknown --model-name '{args.model_name}' (valid: {', '.join(pj.KNOWN_MODELS)})")
    grad = pj.params_bytes(args.model_params, args.model_name)
    compute = args.step_compute_ms / 1e3 if args.step_compute_ms else None
    if args.compute_from:
        row, curves = load_run(args.compute_from)
        if not row.get("samples_per_sec_median"):
            raise UsageError(f"--compute-from {args.compute_from}: no throughput in that run")
        compute = compute or row["global_batch"] / row["samples_per_sec_median"]
        grad = grad or row["grad_bytes_per_step"]
    if not grad or not compute:
        raise UsageError("--project needs the gradient size (--model-params, --model-name or --compute-from) "
                         "and the compute time (--step-compute-ms or --compute-from)")
    if not 0 <= args.overlap < 1 or args.gpus_per_server < 1 or args.max_workers < 1:
        raise UsageError("--overlap must be in [0, 1), --gpus-per-server and --max-workers >= 1")
    workers = pj.powers_of_two(1, args.max_workers)
    rows = pj.project(grad, compute, workers, ring, ps, shards=pj.powers_of_two(1, 8),
                      per_server=args.gpus_per_server, overlap=args.overlap)
    os.makedirs(args.out, exist_ok=True)
    text = (f"# Scaling projection\n\ngradient {grad / 1e6:.1f} MB, compute {compute * 1e3:.1f} ms/step, "
            f"ring: {ring['bandwidth'] * 8 / 1e9:.2f} Gbit/s, alpha {ring['alpha'] * 1e6:.1f} us; "
            f"PS: {ps['bandwidth'] * 8 / 1e9:.2f} Gbit/s, alpha {ps['alpha'] * 1e6:.1f} us; "
            f"{args.gpus_per_server} worker(s) per server; overlap {args.overlap:.0%}\n\n" + pj.table(rows) + "\n")
    with open(os.path.join(args.out, "projection.md"), "w") as f:
        f.write(text + "\n![projection](projection.png)\n")
    with open(os.path.join(args.out, "projection.json"), "w") as f:
        f.write(pj.dumps({"grad_bytes": grad, "compute_s": compute, "ring": ring, "ps": ps,
                          "overlap": args.overlap, "gpus_per_server": args.gpus_per_server, "rows": rows}))
    pj.plot(rows, os.path.join(args.out, "projection.png"), f"{grad / 1e6:.0f} MB gradients, "
            f"{compute * 1e3:.0f} ms compute")
    print(text)
    return 0


def trainer_args_of(args, parser):
    """The shared trainer flags the user gave, to pass through to every run unchanged."""
    out = []
    skip = {"train_dir", "workers", "backends", "num_ps", "run_timeout", "dry_run", "from_dirs", "progress",
            "resume", "help"}
    for action in parser._actions:
        if not action.option_strings or action.dest in skip:
            continue
        value = getattr(args, action.dest)
        if value == action.default:
            continue
        flag = action.option_strings[0]
        if isinstance(value, bool):
            out += [flag, "true" if value else "false"]
        elif isinstance(value, tuple):
            out += [flag, ",".join(str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return out


@cli
def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)
    cfg = from_args(args)
    args.out = cfg.train_dir
    if args.num_ps < 1:
        raise UsageError("--num_ps must be at least 1")
    if args.project:
        return run_projection(args)
    if args.from_dirs:
        runs = runs_from_dirs(args.from_dirs)
    else:
        trainer_args = trainer_args_of(args, parser)
        runs = plan_runs(args, trainer_args, os.cpu_count() or 1)
        if args.dry_run:
            for run in runs:
                print(shlex.join(run["cmd"]))
            return 0
        if os.path.exists(os.path.join(args.out, "report.md")):
            raise UsageError(f"--out {args.out} already holds a report; choose another directory "
                             f"or rebuild it with --from {args.out}")
        execute(runs, args.run_timeout, progress=args.progress)
    rows = collect(runs)
    table = write_report(rows, args.out, cfg.to_dict(), environment_of(rows))
    print(table)
    print(f"\nreport: {os.path.join(args.out, 'report.md')}")
    return 0 if all(r.get("status") == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
