"""The comparison report: one row per run, scaling efficiency, report.md, CSV/JSON and plots.

Reads only what the trainers wrote (metrics.jsonl, docs/metrics.md), so a
report can be rebuilt from run directories copied off a cluster
(``hvdps-compare --from``) without training again.
"""
import csv
import json
import os

from common.errors import UsageError
from common.metrics import load_run, read_records

COLUMNS = ("backend", "mode", "workers", "num_ps", "status", "samples_per_sec_median",
           "samples_per_sec_mean", "samples_per_sec_error", "scaling_efficiency", "time_to_target",
           "final_test_accuracy", "final_test_loss", "grad_bytes_per_step", "wall_time",
           "global_batch", "oversubscribed", "error", "run_dir")


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
            if header and all(k in header for k in ("backend", "mode", "world_size")):
                runs.append({"backend": header["backend"], "mode": header["mode"],
                             "workers": header["world_size"], "run_dir": c, "returncode": None})
    if not runs:
        raise UsageError(f"--from: no runs (metrics.jsonl) found in {', '.join(dirs)}")
    return sorted(runs, key=lambda r: (r["backend"], r["mode"], r["workers"]))
