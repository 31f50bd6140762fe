"""The comparison report: one row per run, scaling efficiency, report.md, CSV/JSON and plots.

Reads only what the trainers wrote (metrics.jsonl, docs/metrics.md), so a
report can be rebuilt from run directories copied off a cluster
(``hvdps compare --from``) without training again.
"""
import csv
import io
import json
import os
import textwrap

from common.backend import MIN_SHARD_BYTES
from common.errors import UsageError
from common.files import make_dirs, write_atomic
from common.metrics import load_run, read_records
from hvdps import methods

COLUMNS = ("model", "backend", "mode", "workers", "num_ps", "status", "samples_per_sec_median",
           "samples_per_sec_mean", "samples_per_sec_error", "scaling_efficiency", "time_to_target",
           "final_test_accuracy", "final_test_loss", "grad_bytes_per_step", "wall_time",
           "global_batch", "oversubscribed", "startup_s", "teardown_s", "warmup_s", "warmup_share", "step_s", "compute_s",
           "overhead_s", "overhead_share", "exchange_s", "wait_s", "wait_per_worker_s", "bytes_per_step_per_worker", "bytes_per_update_per_ps",
           "sparse_bytes", "sparse_table_bytes", "wire_rule",
           "ps_cpu_s", "ps_cpu_share", "busiest_link_bytes", "busiest_link_predicted", "link_bytes_ratio",
           "round_s", "link_utilisation", "link_rate_bps", "cores_busy", "error", "run_dir")
RUN_RECORD = "compare_run.json"    # written by hvdps compare next to each run: its wall time from launch



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
            row["status"] = "interrupted" if run.get("interrupted") else "failed"
        row["error"] = run.get("error")
        row["oversubscribed"] = run.get("oversubscribed", False)
        row["_curves"] = curves
        record = _run_record(run["run_dir"])
        add_startup(row, curves, run.get("seconds") or record.get("seconds"),
                    run.get("launched_at") or record.get("launched_at"))
        add_links(row, curves, run.get("roles") or record.get("roles"))
        rows.append(row)
    add_scaling(rows)
    return rows


def _run_record(run_dir):
    from common.schemas import read_run_record
    path = os.path.join(run_dir, RUN_RECORD)
    return read_run_record(path) if os.path.lexists(path) else {}


def add_startup(row, curves, run_seconds, launched_at=None):
    """Warm-up = the trainer's time before its first measured interval (tracing, the excluded
    steps, the first negotiation or session); its share of the trainer's wall time says whether
    the throughput columns describe steady state. Start-up = everything from launch to that point
    (processes, cluster, TensorFlow import, then the warm-up): what one run of this backend
    costs before it trains at speed. Teardown = the trainer's end to the job's exit (releasing PS
    tasks, MPI finalisation); known when the launch time was recorded, else it is counted in
    start-up (runs recorded before launch times were)."""
    steps = (curves or {}).get("steps") or []
    total = ((curves or {}).get("summary") or {}).get("total_time")
    counted = [i for i, s in enumerate(steps) if s.get("samples_per_sec") is not None]
    if not counted or not total:
        return
    first = counted[0]
    row["warmup_s"] = steps[first - 1]["wall_time"] if first > 0 else 0.0
    row["warmup_share"] = row["warmup_s"] / total
    start = ((curves or {}).get("header") or {}).get("start_time")
    if run_seconds and launched_at and start:
        row["startup_s"] = max(0.0, start - launched_at) + row["warmup_s"]
        row["teardown_s"] = max(0.0, launched_at + run_seconds - (start + total))
    elif run_seconds:
        row["startup_s"] = max(0.0, run_seconds - total) + row["warmup_s"]


def add_links(row, curves, roles):
    """Where the run's tasks ran (``--hosts``) and, where the links' counters were sampled
    (hvdps emulate), the bytes per round each host's link carried against the formula
    (hvdps/links.py), the busiest link's share of its rate, and the round time."""
    from common.metrics import measured_interval
    from hvdps.links import LINKS_FILE, cores_busy, link_rows
    row["roles"] = roles or None
    from common.schemas import read_links
    path = os.path.join(row["run_dir"], LINKS_FILE)
    if not os.path.lexists(path) or not curves:
        return
    links = read_links(path)
    interval = measured_interval(curves.get("header") or {}, curves.get("steps") or [])
    row["cores_busy"] = cores_busy(links, interval)
    table = link_rows(None, row, curves, links, interval)
    if not table:
        return
    row["links"], row["roles"] = table, row["roles"] or links.get("roles")
    busiest = max(table, key=lambda x: max(x["in"], x["out"]))
    way = "in" if busiest["in"] >= busiest["out"] else "out"
    row["busiest_link_bytes"] = busiest[way]
    row["busiest_link_predicted"] = busiest["predicted_" + way]
    # Worst measured/formula over the links that carry a tenth of the model or more: on a shard of a few
    # kB the fixed costs of each RPC (step counter reads, headers) outweigh the tensors themselves.
    floor = 0.1 * (row.get("grad_bytes_per_step") or 0)
    ratios = [x[w] / x["predicted_" + w] for x in table for w in ("in", "out")
              if x.get("predicted_" + w) and x["predicted_" + w] >= floor]
    row["link_bytes_ratio"] = max(ratios, key=lambda q: abs(q - 1)) if ratios else None
    row["round_s"] = (interval[1] - interval[0]) / busiest["rounds"]
    row["link_rate_bps"] = links.get("rate_bps")
    if row["link_rate_bps"]:
        row["link_utilisation"] = row["busiest_link_bytes"] * 8 / row["round_s"] / row["link_rate_bps"]


def links_section(rows):
    """Markdown: each run's tasks by host and, where measured, its links' bytes per round."""
    placed = [r for r in rows if r.get("roles") or r.get("links")]
    if not placed:
        return []
    measured = any(r.get("links") for r in placed)
    lines = ["## Hosts and links", ""]
    if measured:
        rate = next((r["link_rate_bps"] for r in placed if r.get("link_rate_bps")), None)
        lines += ["Bytes each host's link carried per round (one step of every worker), from the interface "
                  "counters over the measured interval, against the formula (ring: 2(n-1)/n x M each way on "
                  "every host with ranks; PS: each task's share of M per worker on another host, each way; "
                  "hvdps/links.py). Counters include Ethernet/IP/TCP headers (about 4-5% at a 1500-byte MTU). "
                  + (f"Each link: {rate / 1e6:g} Mbit/s both ways. " if rate else "") +
                  "*Busiest link* = its bytes per round over the round time, as a share of the link's rate; "
                  "*cores busy* = the share of the machine's cores busy over the measured interval (every "
                  "emulated host runs on them: near 100%, the cores, not the links, may set the step).", "",
                  "| run | round (ms) | busiest link | host | tasks | in (bytes/round) | formula | out (bytes/round) | formula |",
                  "|---|---|---|---|---|---|---|---|---|"]
    else:
        lines += ["| run | host | tasks |", "|---|---|---|"]
    for r in placed:
        name = f"{r.get('model') or '-'} {name_of(r)}, {r['workers']} workers"
        if r.get("links"):
            util = f"{100 * r['link_utilisation']:.0f}% of rate" if r.get("link_utilisation") is not None else "-"
            if r.get("cores_busy") is not None:
                util += f", cores {100 * r['cores_busy']:.0f}% busy"
            for i, x in enumerate(r["links"]):
                head = f"{name} | {1000 * r['round_s']:.1f} | {util}" if i == 0 else " | | "
                lines.append(f"| {head} | {x['host']} | {', '.join(x['tasks']) or '-'} | {x['in']:,.0f} | "
                             f"{_fmt_bytes(x['predicted_in'])} | {x['out']:,.0f} | {_fmt_bytes(x['predicted_out'])} |")
        elif measured:
            lines.append(f"| {name} | - | - | " + "; ".join(f"{h}: {t}" for t, h in (r.get("roles") or {}).items())
                         + " | | | | | |")
        else:
            by_host = {}
            for task, host in (r.get("roles") or {}).items():
                by_host.setdefault(host, []).append(task)
            for host, tasks in by_host.items():
                lines.append(f"| {name} | {host} | {', '.join(tasks)} |")
    sentences = [_link_sentence(r) for r in placed if r.get("links")]
    return lines + ([""] + [s for s in sentences if s] if any(sentences) else []) + [""]


def shards_section(rows):
    """Markdown: how each run with several PS tasks splits the model's bytes over them (header
    ``ps_shard_bytes``, ``placement``): what each PS link carries per worker batch, each way."""
    lines = []
    for r in rows:
        header = (r.get("_curves") or {}).get("header") or {}
        shares = header.get("ps_shard_bytes") or {}
        total = sum(shares.values())
        if len(shares) < 2 or not total:
            continue
        split = sorted(name for name, devices in (header.get("placement") or {}).items() if len(devices) > 1)
        lines.append(f"| {r.get('model') or '-'} {name_of(r)}, {r['workers']} workers | " +
                     ", ".join(f"{task} {b:,} ({100 * b / total:.0f}%)" for task, b in sorted(shares.items())) +
                     f" | {max(shares.values()) * len(shares) / total:.2f} | {', '.join(split) or '-'} |")
    if not lines:
        return []
    return ["## Model bytes per PS task", "",
            "The trainable variables' bytes each PS task holds, so what its link carries per worker batch each "
            f"way (header `ps_shard_bytes`). Both PS trainers split a variable larger than {MIN_SHARD_BYTES:,} "
            "bytes along its first axis, at most one shard per task, and place shards and whole variables "
            "round robin; *busiest / even* is the largest task's bytes over M/k.", "",
            "| run | bytes per PS task | busiest / even | split variables |", "|---|---|---|---|"] + lines + [""]


def _fmt_bytes(v):
    return "-" if v is None else f"{v:,.0f}"


def _link_sentence(r):
    """The busiest link in multiples of the model's bytes M, measured against the formula."""
    m = r.get("grad_bytes_per_step")
    if not m or r.get("busiest_link_bytes") is None or r["busiest_link_bytes"] < 0.01 * m:
        return None                   # nothing crossed a link (one worker under all-reduce)
    text = (f"- {r.get('model') or '-'}, {name_of(r)}, {r['workers']} workers" +
            f": the busiest link carried {r['busiest_link_bytes'] / m:.2f} x M per round")
    if r.get("busiest_link_predicted"):
        text += f" (formula {r['busiest_link_predicted'] / m:.2f} x M; measured/formula {r['busiest_link_bytes'] / r['busiest_link_predicted']:.2f})"
    if r.get("link_utilisation") is not None:
        text += f", {100 * r['link_utilisation']:.0f}% of its rate over {1000 * r['round_s']:.1f} ms rounds"
    return text + "."


def add_scaling(rows):
    """Efficiency = throughput(n) / (n * throughput(1)) within the same workload, backend and mode."""
    base = {(r.get("model"), r["backend"], r["mode"], r.get("num_ps")): r.get("samples_per_sec_median")
            for r in rows if r["workers"] == 1 and r.get("status") == "ok"}
    for r in rows:
        b, t = base.get((r.get("model"), r["backend"], r["mode"], r.get("num_ps"))), r.get("samples_per_sec_median")
        r["scaling_efficiency"] = (t / (r["workers"] * b)) if b and t and r.get("status") == "ok" else None


def _fmt(v, digits=3):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def write_report(rows, out, cfg_dict, environment):
    make_dirs(out)
    plain = [{k: r.get(k) for k in COLUMNS} for r in rows]
    write_atomic(os.path.join(out, "results.json"),
                 json.dumps({"rows": plain, "config": cfg_dict, "environment": environment}, indent=2))
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=COLUMNS)
    w.writeheader()
    w.writerows(plain)
    write_atomic(os.path.join(out, "results.csv"), buf.getvalue())
    plots = write_plots(rows, out)
    table = ["| workload | backend | mode | workers | PS | samples/sec (median) | mean ± 95% | scaling eff. | "
             "time to target (s) | test acc. | test loss | wire bytes/worker step | step = compute + overhead (ms) | "
             "wall (s) | start-up (s) | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tp = ("-" if r.get("samples_per_sec_mean") is None else
              f"{r['samples_per_sec_mean']:.0f} (one interval)" if r.get("samples_per_sec_error") is None else
              f"{r['samples_per_sec_mean']:.0f} ± {r['samples_per_sec_error']:.0f}")
        eff = f"{100 * r['scaling_efficiency']:.0f}%" if r.get("scaling_efficiency") is not None else "-"
        status = r.get("status") or "-"
        if r.get("oversubscribed"):
            status += " (oversubscribed)"
        if r.get("error"):
            status += f": {r['error']}"
        startup = ((f"{r['startup_s']:.1f}" if r.get("startup_s") is not None else "-") +
                   (f" (warm-up {100 * r['warmup_share']:.0f}%)" if r.get("warmup_share") is not None else "") +
                   (f" + {r['teardown_s']:.1f} teardown" if r.get("teardown_s") is not None else ""))
        table.append(f"| {r.get('model') or '-'} | {r['backend']} | {r['mode']} | {r['workers']} | "
                     f"{r.get('num_ps') or '-'} | "
                     f"{_fmt(r.get('samples_per_sec_median'))} | {tp} | {eff} | {_fmt(r.get('time_to_target'))} | "
                     f"{_fmt(r.get('final_test_accuracy'))} | {_fmt(r.get('final_test_loss'))} | "
                     f"{_fmt(r.get('bytes_per_step_per_worker'))} | {_split(r)} | {_fmt(r.get('wall_time'))} | {startup} | {status} |")
    findings = verdicts(rows)
    reasons = explanations(rows)
    # The answer first: what a user came for is which method wins, by how much; the table, each step's
    # parts and the links follow as the evidence.
    lines = ["# hvdps comparison", ""]
    if findings:
        lines += ["## Verdict", ""] + findings + ["", method_note(rows), ""]
    lines += ["## Runs", ""] + table
    if reasons:
        lines += ["", "Where each step's time goes (compute = the same step timed alone with no exchange, "
                  "in the same job; overhead = the measured step minus that; docs/metrics.md):", ""] + reasons
    if findings:
        lines += ["", "Start-up: from launch to the first measured interval (processes, "
                  "cluster, TensorFlow import, tracing, the excluded warm-up steps); in brackets "
                  "the warm-up's share of the trainer's wall time; teardown: from the trainer's end to "
                  "the job's exit (releasing PS tasks, MPI finalisation). None of these is in the "
                  "throughput columns."]
    lines += [""] + links_section(rows) + shards_section(rows)
    lines += ["Throughput excludes the first `--warmup_steps` steps; ± is the 95% half-width over "
              "logging intervals. Scaling efficiency = throughput(n) / (n × throughput(1)) for the same "
              "backend and mode. A run is *oversubscribed* when it starts more processes than this "
              "machine has cores: its scaling figures measure contention, not the method.", "",
              "## Environment", ""]
    lines += [f"- {k}: {v}" for k, v in environment.items()]
    lines += ["", "## Config", "", "```json", json.dumps(cfg_dict, indent=2, sort_keys=True), "```", ""]
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    write_atomic(os.path.join(out, "report.md"), "\n".join(lines))
    return "\n".join(["# hvdps comparison", ""] + table + [""] + findings + ([""] + reasons if reasons else []))


def name_of(r):
    name = methods.label(r["backend"], r["mode"])
    return name + (f" ({r['num_ps']} PS)" if (r.get("num_ps") or 0) > 1 else "")


def within_noise(a, b):
    """True when the 95% intervals of two runs' mean throughput overlap; None when either run
    has no interval (a single logging interval: nothing to tell noise from a difference with)."""
    if a.get("samples_per_sec_error") is None or b.get("samples_per_sec_error") is None \
            or a.get("samples_per_sec_mean") is None or b.get("samples_per_sec_mean") is None:
        return None
    gap = abs(a["samples_per_sec_mean"] - b["samples_per_sec_mean"])
    return gap <= a["samples_per_sec_error"] + b["samples_per_sec_error"]


def verdicts(rows):
    """One paragraph per workload, at its largest worker count, ranked by what a user pays for.

    First the time to the target accuracy (the run's own ``--target_accuracy``, from launch of
    training to the first evaluation at or above it): who got there first, how much longer the
    others took, and who never got there with the accuracy it ended at. A backend that is faster
    per sample but never reaches the target does not win. Then throughput by median, with each
    difference called noise where the two runs' 95% intervals of the mean overlap. Then each
    run's own start-up (never an average over worker counts)."""
    out = []
    for model in sorted({r.get("model") for r in rows if r.get("model")}):
        ok = [r for r in rows if r.get("model") == model and r.get("status") == "ok"]
        if not ok:
            continue
        n = max(r["workers"] for r in ok)
        at_n = sorted((r for r in ok if r["workers"] == n), key=name_of)
        target = next((r["target_accuracy"] for r in at_n if r.get("target_accuracy")), None)
        goal = f"the target accuracy {target:g}" if target else "the target accuracy"
        reached = sorted((r for r in at_n if r.get("time_to_target") is not None), key=lambda r: r["time_to_target"])
        never = [r for r in at_n if r.get("time_to_target") is None]
        head = f"- **{model}**, {n} worker(s): "
        if reached:
            best = reached[0]
            text = head + f"{name_of(best)} reaches {goal} first, in {best['time_to_target']:.1f} s"
            if not any(_evaluates_each_epoch(r) for r in reached):
                text += " (evaluated only at the end: each time is the whole run)"
            if reached[1:]:
                text += "; then " + ", ".join(
                    f"{name_of(r)} in {r['time_to_target']:.1f} s ({r['time_to_target'] / best['time_to_target']:.2f}x)"
                    for r in reached[1:])
        else:
            text = head + f"no backend reaches {goal}"
        if never:
            text += ("; never reached it: " if reached else ": ") + ", ".join(
                f"{name_of(r)} (ended at {_fmt(r.get('final_test_accuracy'))})" for r in never)
        text += "."
        text += _throughput_sentence(at_n) + _bytes_sentence(at_n)
        startups = [f"{name_of(r)} {r['startup_s']:.1f} s" for r in at_n if r.get("startup_s") is not None]
        if startups:
            text += " Start-up of these runs: " + ", ".join(startups) + "."
        out.append(text)
    return out


def _evaluates_each_epoch(r):
    return (((r.get("_curves") or {}).get("header") or {}).get("config") or {}).get("eval_every_epoch", True)


def method_note(rows):
    """How the verdicts were reached, with the repeat count and interval method they rest on."""
    counts = sorted({r["intervals"] for r in rows if r.get("status") == "ok" and r.get("intervals")})
    span = (f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}") if counts else "no"
    return ("Verdicts rank the runs at each workload's largest worker count by time to the target accuracy "
            "(one run per backend; from the trainer's start to the first evaluation at or above it: each epoch's, "
            "or with --eval_every_epoch false only the last, when the time is the whole run's), "
            "then by median throughput. A throughput difference is called noise when the two runs' 95% "
            f"intervals of the mean (mean ± 1.96 standard errors over {span} logging intervals per run) overlap.")


def _bytes_sentence(runs):
    """Where the backends' bytes per worker step differ by 2x or more, what each sends, and for a
    model with embedding tables why: rows looked up against whole tables."""
    sent = sorted((r for r in runs if r.get("bytes_per_step_per_worker")), key=lambda r: r["bytes_per_step_per_worker"])
    if len(sent) < 2 or sent[-1]["bytes_per_step_per_worker"] < 2 * sent[0]["bytes_per_step_per_worker"]:
        return ""
    text = " Bytes on the wire per worker step: " + ", ".join(
        f"{name_of(r)} {r['bytes_per_step_per_worker']:,}" for r in sent) + "."
    sparse = next((r for r in sent if r.get("sparse_table_bytes")), None)
    if sparse:
        text += (f" The embedding gradient of one batch is {sparse['sparse_bytes']:,} bytes of looked-up rows and "
                 f"their ids, the tables {sparse['sparse_table_bytes']:,} bytes: a PS pulls and pushes only the "
                 f"rows, Horovod and TF's all-reduce (MWMS) all-gather every worker's rows, a dense all-reduce "
                 f"(bare MPI, Horovod's sparse_as_dense) moves the whole tables.")
    return text


def _throughput_sentence(runs):
    ranked = sorted((r for r in runs if r.get("samples_per_sec_median")), key=lambda r: -r["samples_per_sec_median"])
    if not ranked:
        return ""
    top = ranked[0]
    text = f" Throughput: {name_of(top)} {top['samples_per_sec_median']:,.0f} samples/s"
    others = []
    for r in ranked[1:]:
        noise = within_noise(top, r)
        tag = {True: ", within noise: the 95% intervals overlap", False: "",
               None: ", no interval to tell noise by (one logging interval)"}[noise]
        others.append(f"{top['samples_per_sec_median'] / r['samples_per_sec_median']:.2f}x {name_of(r)} "
                      f"({r['samples_per_sec_median']:,.0f}{tag})")
    return text + (": " + "; ".join(others) if others else "") + "."


def _split(r):
    if r.get("step_s") is None or r.get("compute_s") is None:
        return "-"
    if r["step_s"] < r["compute_s"]:
        # compute is timed in runs of its own: a step faster than it is noise, not a negative overhead
        return f"{1000 * r['step_s']:.2f} = compute ({1000 * r['compute_s']:.2f} alone) + overhead within noise"
    return f"{1000 * r['step_s']:.2f} = {1000 * r['compute_s']:.2f} + {1000 * r['overhead_s']:.2f}"


def _ms(seconds):
    return f"{1000 * seconds:.2f} ms"


def explanations(rows):
    """One sentence per run with a breakdown: what dominates a worker's step, and what the
    distribution overhead is for this method (split where the backend measured its waiting)."""
    out = []
    for r in rows:
        if r.get("status") != "ok" or r.get("step_s") is None or r.get("compute_s") is None:
            continue
        name = methods.label(r["backend"], r["mode"])
        head = f"- {r.get('model') or '-'}, {name}, {r['workers']} worker(s): "
        out.append(head + _step_sentence(r) + _details(r) + ".")
    return out


def step_parts(r):
    """[(what, seconds)] that add up to the measured step: compute, then the overhead, split into
    the measured wait for the other workers and the rest where the run measured the wait.
    At one worker there is no peer: what the overhead is named says so (the method's wording,
    hvdps/methods.py)."""
    method, wait = methods.lookup(r["backend"]), r.get("wait_s")
    names = method.overhead_parts(r["mode"], r.get("workers") == 1, wait is not None) if method else ["distribution"]
    parts = [("compute", r["compute_s"])]
    if len(names) == 2:
        return parts + [(names[0], wait), (names[1], r["overhead_s"] - wait)]
    return parts + [(names[0], r["overhead_s"])]


def _step_sentence(r):
    step, parts = r["step_s"], step_parts(r)
    if len(parts) == 2 and r["overhead_share"] <= 0:
        # compute is timed in its own runs, the step in the training loop: noise can put compute
        # above the step, and "72.89 ms of a 71.52 ms step" reads like a bug
        return (f"compute is the whole step: {_ms(r['compute_s'])} timed on its own against a {_ms(step)} "
                f"step; distribution adds nothing measurable")
    if len(parts) == 2 and r["overhead_share"] < 0.1:
        return (f"compute dominates: {_ms(r['compute_s'])} of a {_ms(step)} step; distribution "
                f"adds {100 * max(r['overhead_share'], 0):.0f}%")
    top = max(parts, key=lambda p: p[1])
    others = [p for p in parts if p is not top]
    said = "; ".join(f"{p[0]} {100 * p[1] / step:.0f}% ({_ms(p[1])})" for p in others)
    return (f"{100 * top[1] / step:.0f}% of each step ({_ms(top[1])} of {_ms(step)}) is {top[0]}, the largest "
            f"part; {said}")


def _details(r):
    text = ""
    waits = r.get("wait_per_worker_s")
    if waits and len(waits) > 1:
        name = lambda i: f"rank {i}" + (" (the chief)" if i == 0 else "")
        each = ", ".join(f"{name(i)} {_ms(w)}" for i, w in enumerate(waits))
        least = min(range(len(waits)), key=waits.__getitem__)
        text += f"; wait per step: {each}; the one that waits least, {name(least)}, is the slowest"
    if r.get("exchange_s") is not None:
        text += f"; measured inside MPI_Allreduce: {_ms(r['exchange_s'])}"
    if r.get("bytes_per_step_per_worker"):
        text += f"; {r['bytes_per_step_per_worker']:,} bytes on the wire per worker step"
    if r.get("ps_cpu_share") is not None:
        text += (f"; the PS task(s) used {r['ps_cpu_s']:.1f} CPU s in the measured interval, "
                 f"{100 * r['ps_cpu_share']:.0f}% of a core each")
    if r.get("oversubscribed"):
        text += " (oversubscribed: contention included)"
    return text


MARKERS = "os^Dv<>"          # 7, prime to tab20's 20 colours: 140 series before a look repeats


def series_styles(labels):
    """{label: (colour, marker)}, one each: matplotlib's ten colours repeat from the eleventh line,
    so past ten the 20 of tab20, and the marker varies too, so no two of a panel's series look
    alike (an emulated pass has 12: three rings, three PS variants with 1, 2 and 4 shards)."""
    import matplotlib
    cmap = matplotlib.colormaps["tab10" if len(labels) <= 10 else "tab20"]
    return {label: (cmap(i % cmap.N), MARKERS[i % len(MARKERS)]) for i, label in enumerate(labels)}


LEGEND_INSIDE = 6                # more entries than this: one legend beside the row, not over its lines
LEGEND_ROWS = 24                 # entries per column of such a legend


def _save(fig, out, name, legend_size):
    """Grid and legend on every panel that has a labelled line; the PNG written; its name. A row of
    panels whose legend would hide its lines (more than LEGEND_INSIDE entries: an emulated pass has
    48 runs) gets one legend, its panels' entries once each, right of its last panel; the PNG
    grows to hold it."""
    import math
    import matplotlib.pyplot as plt
    rows, beside = {}, []
    for ax in fig.axes:
        ax.grid(alpha=0.3)
        rows.setdefault(ax.get_subplotspec().rowspan.start if ax.get_subplotspec() else id(ax), []).append(ax)
    for axes in rows.values():
        entries = {}
        for ax in axes:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                entries.setdefault(label, handle)
        if len(entries) > LEGEND_INSIDE:
            legend = axes[-1].legend(list(entries.values()), list(entries), fontsize=legend_size, loc="upper left",
                                     bbox_to_anchor=(1.01, 1.0), ncol=math.ceil(len(entries) / LEGEND_ROWS))
            legend.set_in_layout(False)        # the panels keep their size; the saved PNG widens instead
            beside.append(legend)
            continue
        for ax in axes:
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=legend_size)
    fig.tight_layout()
    write_atomic(os.path.join(out, name), lambda f: fig.savefig(f, format="png", dpi=100, bbox_inches="tight",
                                                                bbox_extra_artists=beside))
    plt.close(fig)
    return name


def write_breakdown_plot(rows, out):
    """Stacked bars per backend x workers: compute vs distribution overhead, ms per worker step;
    the overhead split into the measured wait for the other workers and the rest where a run has
    it. One panel per workload, each on its own scale (a 1 ms MLP step beside a 80 ms CNN step
    would be invisible)."""
    import matplotlib.pyplot as plt
    runs = [r for r in rows if r.get("status") == "ok" and r.get("step_s") is not None and r.get("compute_s")]
    if not runs:
        return None
    groups = _workloads(runs)
    fig, axes = plt.subplots(len(groups), 1, figsize=(max(6, 1.1 * max(map(len, groups.values())) + 3),
                                                     3.6 * len(groups)), squeeze=False)
    for (model, group), (ax,) in zip(groups.items(), axes):
        group = sorted(group, key=lambda r: (_label(r), r["workers"]))
        # a bar is 1.1 inch wide: a method's name wraps at word boundaries so its neighbours' stay legible
        labels = [textwrap.fill(_label(r), 16, break_long_words=False) + f"\n{r['workers']} worker(s)"
                  for r in group]
        compute = [1000 * min(r["compute_s"], r["step_s"]) for r in group]
        overhead = [1000 * max(r["step_s"] - r["compute_s"], 0.0) for r in group]
        wait = [min(1000 * max(r.get("wait_s") or 0.0, 0.0), o) for r, o in zip(group, overhead)]
        xs = range(len(group))
        ax.bar(xs, compute, label="compute (no exchange)")
        ax.bar(xs, [o - w for o, w in zip(overhead, wait)], bottom=compute,
               label="distribution overhead" + (" (the rest)" if any(wait) else ""))
        if any(wait):
            ax.bar(xs, wait, bottom=[c + o - w for c, o, w in zip(compute, overhead, wait)],
                   label="of which waiting for the other workers (measured)")
        ax.set_xticks(list(xs), labels, fontsize=8)
        # bars stick to the axes' edge: room above the tallest, so neither it nor the legend hides it
        ax.set_ylim(0, 1.25 * max(c + o for c, o in zip(compute, overhead)))
        ax.set(ylabel="ms per worker step", title=f"{model}: where a step's time goes")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    write_atomic(os.path.join(out, "breakdown.png"), lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)
    return "breakdown.png"


def _workloads(rows):
    """{workload: its rows}, in a stable order: one panel each in every plot."""
    out = {}
    for r in rows:
        out.setdefault(r.get("model") or "-", []).append(r)
    return dict(sorted(out.items()))


def _label(r):
    return name_of(r)


def write_plots(rows, out):
    """throughput.png (throughput with its 95% interval, and scaling efficiency, against workers)
    and accuracy_vs_time.png: one row of panels per workload, so lines of different models never
    join, each panel titled with its workload; worker ticks are the worker counts run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    written = []
    groups = _workloads(rows)
    # one look per method across the workloads' panels (and per method and workers in accuracy_vs_time.png)
    styles = series_styles(sorted({_label(r) for r in rows if r.get("samples_per_sec_median") and r.get("status") == "ok"}))
    fig, axes = plt.subplots(len(groups), 2, figsize=(11, 3.6 * len(groups)), squeeze=False)
    for (model, rs), (ax1, ax2) in zip(groups.items(), axes):
        series = {}
        for r in rs:
            if r.get("samples_per_sec_median") and r.get("status") == "ok":
                series.setdefault(_label(r), []).append(r)
        ticks = sorted({r["workers"] for r in rs})
        drawn = 0
        for label, runs in sorted(series.items()):
            runs.sort(key=lambda r: r["workers"])
            colour, marker = styles[label]
            ax1.errorbar([r["workers"] for r in runs], [r["samples_per_sec_median"] for r in runs],
                         yerr=[r.get("samples_per_sec_error") or 0.0 for r in runs], fmt=f"{marker}-", capsize=4,
                         color=colour, label=label)
            eff = [(r["workers"], r["scaling_efficiency"]) for r in runs if r.get("scaling_efficiency") is not None]
            if eff:
                ax2.plot(*zip(*eff), f"{marker}-", color=colour, label=label)
                drawn += 1
        if not drawn:                                  # e.g. make emulate-scale: 2 workers and up
            ax2.text(0.5, 0.5, "no 1-worker run of this workload:\nscaling efficiency needs throughput(1)",
                     ha="center", va="center", transform=ax2.transAxes, color="grey")
        ax1.set(xlabel="workers", ylabel="samples/sec (median, 95% interval)", title=f"{model}: throughput")
        rates = [r["samples_per_sec_median"] for runs in series.values() for r in runs]
        if rates and max(rates) > 20 * min(rates):   # e.g. one worker with no link against shaped links:
            ax1.set_yscale("log")                      # a linear axis would flatten every multi-worker run
        ax2.set(xlabel="workers", ylabel="throughput(n) / (n x throughput(1))", ylim=(0, 1.2),
                title=f"{model}: scaling efficiency")
        for ax in (ax1, ax2):
            ax.set_xticks(ticks)
    written.append(_save(fig, out, "throughput.png", legend_size=8))

    curve_label = lambda r: f"{_label(r)}, {r['workers']} worker(s)"      # noqa: E731
    styles = series_styles(list(dict.fromkeys(curve_label(r) for r in sorted(rows, key=lambda r: (_label(r), r["workers"]))
                                        if (r.get("_curves") or {}).get("evals"))))
    fig, axes = plt.subplots(len(groups), 2, figsize=(11, 3.6 * len(groups)), squeeze=False)
    for (model, rs), (ax1, ax2) in zip(groups.items(), axes):
        target = next((r["target_accuracy"] for r in rs if r.get("target_accuracy")), None)
        shown = [r for r in sorted(rs, key=lambda r: (_label(r), r["workers"]))
                 if (r.get("_curves") or {}).get("evals")]
        for r in shown:
            evals = r["_curves"]["evals"]
            label = curve_label(r)
            colour, marker = styles[label]
            for ax, key in ((ax1, "accuracy"), (ax2, "loss")):
                ax.plot([e["wall_time"] for e in evals], [e[key] for e in evals], f"{marker}-", ms=3,
                        color=colour, label=label)
        if target:
            ax1.axhline(target, color="grey", ls="--", lw=1, label=f"target {target:g}")
        ax1.set(xlabel="seconds since the trainer started", ylabel="test accuracy", title=f"{model}: accuracy vs time")
        ax2.set(xlabel="seconds since the trainer started", ylabel="test loss", title=f"{model}: loss vs time")
    written.append(_save(fig, out, "accuracy_vs_time.png", legend_size=7))
    stacked = write_breakdown_plot(rows, out)
    return written + ([stacked] if stacked else [])


def environment_of(rows):
    import platform
    header = next(((r.get("_curves") or {}).get("header") for r in rows if (r.get("_curves") or {}).get("header")), {})
    env = {"host": header.get("host", platform.node()), "cores": os.cpu_count()}
    env.update({k: v for k, v in (header.get("versions") or {}).items()})
    by_keras = {}                    # which Keras built each run's model (common/keras3.py: keras_of)
    for r in rows:
        kind = ((r.get("_curves") or {}).get("header") or {}).get("keras")
        if kind:
            by_keras.setdefault(kind, []).append(os.path.basename(r.get("run_dir") or "?"))
    if len(by_keras) == 1:
        env["model built with"] = f"{next(iter(by_keras))} (every run)"
    elif by_keras:
        env["model built with"] = "; ".join(f"{k}: {', '.join(names)}" for k, names in sorted(by_keras.items()))
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
