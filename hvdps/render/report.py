"""The comparison report: one row per run, scaling efficiency, report.md, CSV/JSON and plots.

Reads only what the trainers wrote (metrics.jsonl, docs/metrics.md), so a
report can be rebuilt from run directories copied off a cluster
(``hvdps compare --from``) without training again.
"""
import csv
import io
import json
import os

import numpy as np

from common.base.files import make_dirs, write_atomic
from hvdps.measure.load import SHARED_SHARE
from hvdps import methods
from hvdps.render.plots import write_plots
from hvdps.render import unhealthy
from hvdps.render.styles import name_of
from hvdps.tune.hints import hints
from hvdps.measure.identity import settings_text
from hvdps.measure.rows import unresolved
from common.inputs.records import SHARDING


COLUMNS = ("model", "backend", "mode", "workers", "tasks", "settings", "status", "samples_per_sec_median",
           "samples_per_sec_mean", "samples_per_sec_error", "scaling_efficiency", "time_to_target",
           "final_test_accuracy", "final_test_loss", "grad_bytes_per_step", "wall_time",
           "global_batch", "oversubscribed", "startup_s", "teardown_s", "warmup_s", "warmup_share", "step_s", "compute_s",
           "overhead_s", "overhead_share", "exchange_s", "wait_s", "bytes_per_step_per_worker", "sparse_bytes",
           "sparse_table_bytes", "wire_rule",
           "busiest_link_bytes", "busiest_link_predicted", "link_bytes_ratio",
           "round_s", "link_utilisation", "link_rate_bps", "cores_busy", "others_cores", "job_cores", "hypervisor_cores",
           "kernel_cores", "machine_cores", "shared", "condition", "repeat", "error", "run_dir")


def columns_of():
    """results.csv's columns: the figures every run has, then each method's own measures (declared by
    its package: ``Method.measured``) before the run's condition, error and folder."""
    tail = COLUMNS.index("condition")
    return COLUMNS[:tail] + methods.measured_columns() + COLUMNS[tail:]


def links_section(rows):
    """Markdown: each run's tasks by host and, where measured, its links' bytes per round."""
    placed = [r for r in rows if r.roles or r.links.hosts]
    if not placed:
        return []
    measured = any(r.links.hosts for r in placed)
    lines = ["## Hosts and links", ""]
    if measured:
        rate = next((r.links.link_rate_bps for r in placed if r.links.link_rate_bps), None)
        own = {h: bps for r in placed for h, bps in (r.links.link_rates or {}).items() if rate and bps != rate}
        lines += ["Bytes each host's link carried per round (one step of every worker), from the interface "
                  "counters over the measured interval, against the formula (ring: 2(n-1)/n x M each way on "
                  "every host with ranks; PS: each task's share of M per worker on another host, each way; "
                  "hvdps/measure/links.py). Counters include Ethernet/IP/TCP headers (about 4-5% at a 1500-byte MTU). "
                  + (f"Each link: {rate / 1e6:g} Mbit/s both ways" if rate else "")
                  + "".join(f"; {h}'s own, {bps / 1e6:g} Mbit/s" for h, bps in sorted(own.items()))
                  + (". " if rate else "") +
                  "*Busiest link* = its bytes per round over the round time, as a share of the link's rate (of "
                  "the fullest link's own rate, named, where a slower link comes nearer it than the busiest); "
                  "*cores busy* = the share of the machine's cores busy over the measured interval (every "
                  "emulated host runs on them: near 100%, the cores, not the links, may set the step).", "",
                  "| run | round (ms) | busiest link | host | tasks | in (bytes/round) | formula | out (bytes/round) | formula |",
                  "|---|---|---|---|---|---|---|---|---|"]
    else:
        lines += ["| run | host | tasks |", "|---|---|---|"]
    for r in placed:
        name = f"{r.model or '-'} {name_of(r)}, {r.workers} workers"
        if r.links.hosts:
            util = f"{100 * r.links.link_utilisation:.0f}% of rate" if r.links.link_utilisation is not None else "-"
            if r.links.link_utilisation is not None and r.links.fullest_link != r.links.busiest_link:
                util += f" ({r.links.fullest_link}'s own)"
            if r.cores_busy is not None:
                util += f", cores {100 * r.cores_busy:.0f}% busy"
            for i, x in enumerate(r.links.hosts):
                head = f"{name} | {1000 * r.links.round_s:.1f} | {util}" if i == 0 else " | | "
                lines.append(f"| {head} | {x.host} | {', '.join(x.tasks) or '-'} | {x.in_bytes:,.0f} | "
                             f"{_fmt_bytes(x.predicted_in)} | {x.out_bytes:,.0f} | {_fmt_bytes(x.predicted_out)} |")
        elif measured:
            lines.append(f"| {name} | - | - | " + "; ".join(f"{h}: {t}" for t, h in (r.roles or {}).items())
                         + " | | | | | |")
        else:
            by_host = {}
            for task, host in (r.roles or {}).items():
                by_host.setdefault(host, []).append(task)
            for host, tasks in by_host.items():
                lines.append(f"| {name} | {host} | {', '.join(tasks)} |")
    sentences = [_link_sentence(r) for r in placed if r.links.hosts]
    return lines + ([""] + [s for s in sentences if s] if any(sentences) else []) + [""]


def methods_sections(rows):
    """The sections the methods declare of their own (``Method.sections``), each once, in the
    registry's order, over the runs of the methods that declare it."""
    lines, done = [], []
    for method in methods.METHODS.values():
        for section in method.sections:
            if section in done:
                continue
            done.append(section)
            names = {m.name for m in methods.METHODS.values() if section in m.sections}
            lines += section([r for r in rows if r.backend in names])
    return lines


def _fmt_bytes(v):
    return "-" if v is None else f"{v:,.0f}"


def _link_sentence(r):
    """The busiest link in multiples of the model's bytes M, measured against the formula."""
    m = r.grad_bytes_per_step
    if not m or r.links.busiest_link_bytes is None or r.links.busiest_link_bytes < 0.01 * m:
        return None                   # nothing crossed a link (one worker under all-reduce)
    text = (f"- {r.model or '-'}, {name_of(r)}, {r.workers} workers" +
            f": the busiest link carried {r.links.busiest_link_bytes / m:.2f} x M per round")
    if r.links.busiest_link_predicted:
        text += f" (formula {r.links.busiest_link_predicted / m:.2f} x M; measured/formula {r.links.busiest_link_bytes / r.links.busiest_link_predicted:.2f})"
    if r.links.link_utilisation is not None and r.links.fullest_link != r.links.busiest_link:
        text += (f"; the fullest, {r.links.fullest_link}'s own {r.links.fullest_link_bps / 1e6:g} Mbit/s link, carried "
                 f"{100 * r.links.link_utilisation:.0f}% of its rate over {1000 * r.links.round_s:.1f} ms rounds")
    elif r.links.link_utilisation is not None:
        text += f", {100 * r.links.link_utilisation:.0f}% of its rate over {1000 * r.links.round_s:.1f} ms rounds"
    return text + "."


def _fmt(v, digits=3):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


# The report's note under its sections: how the figures were counted.
FOOTNOTE = ("Throughput excludes the first `--warmup_steps` steps and the logging intervals an evaluation or a "
            "checkpoint fell in; ± is the 95% half-width over "
            "logging intervals (with --repeat, of the configuration's median run). Scaling efficiency = "
            "throughput(n) / (n × throughput(1)) for the same backend and mode. A run is *oversubscribed* "
            "when it starts more processes than this machine has cores: its scaling figures measure "
            "contention, not the method. A run is *shared* when, over its measured interval, the rest of "
            "the machine (anything but the run's own processes and this comparison) used more than "
            f"{100 * SHARED_SHARE:.0f}% of its cores (/proc/stat beside each task's /proc/<pid>/stat; "
            "docs/metrics.md): its figures measure that other work too.")


def write_report(rows, out, configs, environment, every_run=None):
    """``rows``: one per configuration (its runs' medians with --repeat); ``every_run``: each run,
    repeats apart, for results.csv and results.json (default: ``rows``); ``configs``: {workload: its
    runs' config}, each workload's Data line read from its own."""
    make_dirs(out)
    write_results(rows if every_run is None else every_run, out, configs, environment)
    plots = write_plots(rows, out)
    plots += [p for p in (unhealthy.write_straggler_plot(rows, out), unhealthy.write_ranks_plot(rows, out)) if p]
    table = runs_table(rows)
    # the healthy runs' verdict; with a slow or stalled worker, what each method keeps of itself comes first
    findings = unhealthy.verdicts(rows) + verdicts([r for r in rows if r.condition is None])
    findings += hint_lines(hints(rows))
    reasons = explanations(rows)
    lines = report_lines(rows, table, findings, reasons, configs, environment, plots)
    write_atomic(os.path.join(out, "report.md"), "\n".join(lines))
    return "\n".join(["# hvdps comparison", ""] + table + [""] + findings + ([""] + reasons if reasons else []))


def write_results(runs, out, configs, environment):
    """results.json and results.csv: a row per run, every column the registry declares."""
    columns = columns_of()
    plain = [{k: r.column(k) for k in columns} for r in runs]
    write_atomic(os.path.join(out, "results.json"),
                 json.dumps({"rows": plain, "config": configs, "environment": environment}, indent=2))
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=columns)
    w.writeheader()
    w.writerows(plain)
    write_atomic(os.path.join(out, "results.csv"), buf.getvalue())


def runs_table(rows):
    """The report's table of runs, one line per configuration, as Markdown lines."""
    table = ["| workload | backend | mode | workers | other tasks | samples/sec (median) | mean ± 95% | scaling eff. | "
             "time to target (s) | test acc. | test loss | wire bytes/worker step | step = compute + overhead (ms) | "
             "wall (s) | start-up (s) | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tp = ("-" if r.samples_per_sec_mean is None else
              f"{r.samples_per_sec_mean:,.0f} (one interval)" if r.samples_per_sec_error is None else
              f"{r.samples_per_sec_mean:,.0f} ± {r.samples_per_sec_error:,.0f}")
        eff = f"{100 * r.scaling_efficiency:.0f}%" if r.scaling_efficiency is not None else "-"
        mode = r.mode + (f" [{settings_text(r.settings)}]" if r.settings else "")
        mode += f" [{r.unhealthy.what if r.unhealthy else r.condition}]" if r.condition else ""
        table.append(f"| {r.model or '-'} | {r.backend} | {mode} | {r.workers} | "
                     f"{methods.tasks_said(r.backend, r.tasks) or '-'} | "
                     f"{_throughput_cell(r)} | {tp} | {eff} | {_fmt(r.time_to_target)} | "
                     f"{_fmt(r.final_test_accuracy)} | {_fmt(r.final_test_loss)} | "
                     f"{_fmt(r.bytes_per_step_per_worker)} | {_split(r)} | {_fmt(r.wall_time)} | "
                     f"{_startup_cell(r)} | {_status_cell(r)} |")
    return table


def _status_cell(r):
    """The outcome, then what the figures measured besides the method."""
    status = r.status or "-"
    if r.error:
        status += f": {r.error}"
    if r.oversubscribed:
        status += " (oversubscribed)"
    if r.load.shared:
        status += f" (shared: {contention_words(r)})"
    if r.left_out:
        status += f" (left out, damaged: {'; '.join(r.left_out)})"
    return status


def _startup_cell(r):
    return ((f"{r.startup.startup_s:.1f}" if r.startup.startup_s is not None else "-") +
            (f" (warm-up {100 * r.startup.warmup_share:.0f}%)" if r.startup.warmup_share is not None else "") +
            (f" + {r.startup.teardown_s:.1f} teardown" if r.startup.teardown_s is not None else ""))


def report_lines(rows, table, findings, reasons, configs, environment, plots):
    """report.md's lines. The answer first: what a user came for is which method wins, by how much;
    the table, each step's parts and the links follow as the evidence."""
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
    lines += [""] + unhealthy.section(rows) + links_section(rows) + methods_sections(rows)
    lines += [FOOTNOTE, "", "## Environment", ""]
    lines += [f"- {k}: {v}" for k, v in environment.items()]
    lines += ["", "## Config", "", "```json", json.dumps(configs, indent=2, sort_keys=True), "```", ""]
    for workload, config in configs.items():
        if config.get("dataset") == "tfrecord":
            rule = config.get("shard_by", "record")
            lines += [f"Data ({workload}): the TFRecord shards in `{config.get('data_dir')}`, `--shard_by {rule}`: "
                      f"{SHARDING.get(rule, '')} (docs/data.md).", ""]
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    return lines


def _throughput_cell(r):
    """The median; with repeated runs, how many and their range."""
    runs = r.repeat_throughputs
    if not runs or len(runs) < 2:
        return _fmt(r.samples_per_sec_median)
    return f"{_fmt(r.samples_per_sec_median)} ({len(runs)} runs: {_fmt(min(runs))}-{_fmt(max(runs))})"


def within_noise(a, b):
    """True when the 95% intervals of two runs' mean throughput overlap; None when either run
    has no interval (a single logging interval: nothing to tell noise from a difference with)."""
    if a.samples_per_sec_error is None or b.samples_per_sec_error is None \
            or a.samples_per_sec_mean is None or b.samples_per_sec_mean is None:
        return None
    gap = abs(a.samples_per_sec_mean - b.samples_per_sec_mean)
    return gap <= a.samples_per_sec_error + b.samples_per_sec_error


def hint_lines(found):
    """A paragraph for each run that its method's cost model says ran far from its best (hvdps/tune/hints.py):
    the setting, the predicted factor, and the entry and the tune line that would check it."""
    lines = []
    for h in found:
        method = methods.get(h.method)
        label = method.label((method.default_modes or method.modes)[0])
        lines += ["", f"**{label} ran far from its best ({h.run}):** its cost model, fed this run's step "
                  f"({1e3 * h.step_s:.2f} ms) and compute ({1e3 * h.compute_s:.2f} ms), predicts {h.factor:.2f}x "
                  f"the throughput at {h.setting}={h.value} (it ran at {h.ran_at}). Check it with "
                  f"`--backends '{h.method},{h.entry}'`, or search its settings with "
                  f"`hvdps tune --workers {h.workers} --backends {h.method}`."]
    return lines


def verdicts(rows):
    """One paragraph per workload, at its largest worker count, ranked by what a user pays for.

    First the time to the target accuracy (the run's own ``--target_accuracy``, from the end of its
    first update to the first evaluation at or above it): who got there first, how much longer the
    others took, and who never got there with the accuracy it ended at. Where every run got there at
    its first evaluation, the time says only when each first evaluated: they are ranked by throughput. A backend that is faster
    per sample but never reaches the target does not win. Then throughput by median, with each
    difference called noise where the two runs' 95% intervals of the mean overlap. Then each
    run's own start-up (never an average over worker counts)."""
    out = []
    for model in sorted({r.model for r in rows if r.model}):
        ok = [r for r in rows if r.model == model and r.status == "ok"]
        if not ok:
            continue
        n = max(r.workers for r in ok)
        at_n = sorted((r for r in ok if r.workers == n), key=name_of)
        target = next((r.target_accuracy for r in at_n if r.target_accuracy), None)
        goal = f"the target accuracy {target:g}" if target else "the target accuracy"
        reached = sorted((r for r in at_n if r.time_to_target is not None), key=lambda r: r.time_to_target)
        never = [r for r in at_n if r.time_to_target is None]
        counts = sorted({r.repeats or 1 for r in at_n})
        runs = "one run each" if counts == [1] else \
            f"{counts[0]} runs each" if len(counts) == 1 else f"{counts[0]}-{counts[-1]} runs each"
        caveats = _caveats(at_n)
        # a caveat ends in a list of runs: the ranking after it is a sentence of its own
        head = f"- **{model}**, {n} worker(s), {runs}" + (f"{caveats}. " if caveats else ": ")
        opening = (lambda words: words[:1].upper() + words[1:]) if caveats else (lambda words: words)
        if len(reached) > 1 and not never and unresolved(reached):
            text = head + opening(_unresolved_words(reached, goal))
        elif reached:
            best = reached[0]
            text = head + opening(f"{name_of(best)} reaches {goal} first, in {best.time_to_target:.1f} s")
            if not any(_evaluates_each_epoch(r) for r in reached):
                text += " (evaluated only at the end: each time is the whole run)"
            if reached[1:]:
                text += "; then " + ", ".join(
                    f"{name_of(r)} in {r.time_to_target:.1f} s ({r.time_to_target / best.time_to_target:.2f}x"
                    f"{_across_runs(best, r, higher_is_better=False)})" for r in reached[1:])
        else:
            text = head + opening(f"no backend reaches {goal}")
        if never:
            text += ("; never reached it: " if reached else ": ") + ", ".join(
                f"{name_of(r)} (ended at {_fmt(r.final_test_accuracy)})" for r in never)
        text += "."
        text += _throughput_sentence(at_n) + _bytes_sentence(at_n) + _precision_sentence(at_n)
        startups = [f"{name_of(r)} {r.startup.startup_s:.1f} s" for r in at_n if r.startup.startup_s is not None]
        if startups:
            text += " Start-up of these runs: " + ", ".join(startups) + "."
        out.append(text)
    return out


def _unresolved_words(reached, goal):
    """The verdict where time to the target cannot rank the runs (rows.unresolved): a race to the first
    evaluations says when each evaluated, not how fast it trained, so they are ranked by throughput."""
    by_rate = sorted(reached, key=lambda r: -(r.samples_per_sec_median or 0.0))
    if all(r.target_at_first_eval for r in reached):
        when = f"every run reaches {goal} at its first evaluation (" + ", ".join(
            f"{name_of(r)} at update {r.curves.evals[0].global_step}" for r in by_rate) + ")"
    else:
        when = (f"every run reaches {goal} within a few evaluations, too far apart to time the crossing (" +
                ", ".join(f"{name_of(r)} between {r.target_window[0]:.2f} and {r.target_window[1]:.2f} s"
                          for r in by_rate) + ")")
    return (when + ", so the time to it measures how soon each evaluated, not how fast it trained: ranked by "
            f"throughput instead, {name_of(by_rate[0])} first, every run's accuracy at or above the target "
            "(evaluate more often to time the crossing: --eval_every_steps)")


def _precision_sentence(runs):
    """The precision the runs trained in and why (their headers'), and which of them the hardware
    emulated: an emulated policy's throughput measures the emulation, not the method."""
    chosen = [r.precision for r in runs if r.precision is not None]
    if not chosen:
        return ""
    text = "".join(f" Precision: {why}." for why in dict.fromkeys(c.why for c in chosen if c.why))
    emulated = [r for r in runs if r.precision is not None and r.precision.emulated]
    if emulated:
        text += (f" **{emulated[0].precision.policy} is emulated by this hardware** in " +
                 ", ".join(name_of(r) + _emulation_factor(r) for r in emulated) +
                 ": their throughput measures the emulation (--precision auto or float32 measures the methods).")
    return text


def _emulation_factor(r):
    """ " (its step at 0.20x float32's, as its probe timed both)", where the probe timed the step in float32 too."""
    if not (r.compute_s and r.float32_compute_s):
        return ""
    return f" (its step at {r.float32_compute_s / r.compute_s:.2f}x float32's speed, as its probe timed both)"


def contention_words(r):
    """Who else took the cores of a shared run: the machine's other processes and, on a virtual
    machine, the hypervisor's other tenants (steal), each with its share."""
    text = f"the rest of the machine used {r.load.others_cores:.2f} of its {r.load.machine_cores} cores"
    if r.load.hypervisor_cores is not None and r.load.hypervisor_cores >= 0.005:
        text += f" and the hypervisor gave {r.load.hypervisor_cores:.2f} to other tenants (steal)"
    return text


def _caveats(runs):
    """What the verdict's runs measured besides their methods, named up front: other work on the
    machine (shared) and more processes than cores (oversubscribed)."""
    out = ""
    shared = [r for r in runs if r.load.shared]
    if shared:
        out += "; **on a shared machine**, measuring the other work too: " + ", ".join(
            f"{name_of(r)} ({contention_words(r)})" for r in shared)
    crowded = [r for r in runs if r.oversubscribed]
    if crowded:
        out += "; **oversubscribed** (more processes than cores): " + ", ".join(name_of(r) for r in crowded)
    return out


def _evaluates_each_epoch(r):
    """Whether the run evaluated along the way (each epoch, or every --eval_every_steps), not only at its end."""
    config = r.header.config if r.header else None
    return config is None or config.eval_every_epoch is not False or bool(config.eval_every_steps)


def method_note(rows):
    """How the verdicts were reached, with the repeat count and interval method they rest on."""
    counts = sorted({r.intervals for r in rows if r.status == "ok" and r.intervals})
    span = (f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}") if counts else "no"
    repeats = max((r.repeats or 1 for r in rows), default=1)
    text = ("Verdicts rank the runs at each workload's largest worker count by time to the target accuracy "
            "(from the end of the trainer's first update, its start-up given apart, to the first evaluation at or "
            "above it: each epoch's and every --eval_every_steps updates', or with --eval_every_epoch false and no "
            "--eval_every_steps only the last, when the time is the whole run's; where every run reached it at "
            "its first evaluation, by throughput), then by median throughput. ")
    if repeats > 1:
        return text + (f"Each configuration ran up to {repeats} times, the methods' order reversed on every other "
                       "pass (A B C, C B A, ...) so that a drift of the machine counts against each in turn; the "
                       "figures are the medians over its runs (results.csv: every run). A difference is called "
                       "real only when the runs show it: their ranges do not overlap, or a bootstrap 95% interval "
                       "of the ratio of the medians (4,000 resamples) excludes 1.")
    return text + ("Each configuration ran once: a drift of the machine between runs cannot be seen "
                   "(--repeat 3 judges across runs). A throughput difference is called noise when the two runs' 95% "
                   f"intervals of the mean (mean ± 1.96 standard errors over {span} logging intervals per run) "
                   "overlap.")


def _bytes_sentence(runs):
    """Where the backends' bytes per worker step differ by 2x or more, what each sends, and for a
    model with embedding tables why: rows looked up against whole tables."""
    sent = sorted((r for r in runs if r.bytes_per_step_per_worker), key=lambda r: r.bytes_per_step_per_worker)
    if len(sent) < 2 or sent[-1].bytes_per_step_per_worker < 2 * sent[0].bytes_per_step_per_worker:
        return ""
    text = " Bytes on the wire per worker step: " + ", ".join(
        f"{name_of(r)} {r.bytes_per_step_per_worker:,.0f}" for r in sent) + "."
    sparse = next((r for r in sent if r.sparse_table_bytes), None)
    if sparse:
        text += (f" The embedding gradient of one batch is {sparse.sparse_bytes or 0:,.0f} bytes of looked-up rows and "
                 f"their ids, the tables {sparse.sparse_table_bytes:,.0f} bytes: a PS pulls and pushes only the "
                 f"rows, Horovod and TF's all-reduce (MWMS) all-gather every worker's rows, a dense all-reduce "
                 f"(bare MPI, Horovod's sparse_as_dense) moves the whole tables.")
    return text


def _throughput_sentence(runs):
    ranked = sorted((r for r in runs if r.samples_per_sec_median), key=lambda r: -r.samples_per_sec_median)
    if not ranked:
        return ""
    top = ranked[0]
    text = f" Throughput: {name_of(top)} {top.samples_per_sec_median:,.0f} samples/s"
    others = []
    for r in ranked[1:]:
        tag = _across_runs(top, r, higher_is_better=True)
        if tag is None:         # one run each: its logging intervals are all there is to tell noise by
            noise = within_noise(top, r)
            tag = {True: ", within noise: the 95% intervals overlap", False: "",
                   None: ", no interval to tell noise by (one logging interval)"}[noise]
        others.append(f"{top.samples_per_sec_median / r.samples_per_sec_median:.2f}x {name_of(r)} "
                      f"({r.samples_per_sec_median:,.0f}{tag})")
    return text + (": " + "; ".join(others) if others else "") + "."


def _across_runs(a, b, higher_is_better):
    """The call on ``a`` against ``b`` across their repeated runs, as the words after a ratio; ""
    with no repeats for time to target, None for throughput (the one-run call applies)."""
    real, why = differ(a, b, higher_is_better)
    if real is None:
        return None if higher_is_better else ""
    return f", {why}" if real is False else f", a real difference: {why}"


def _split(r):
    if r.step_s is None or r.compute_s is None:
        return "-"
    if r.step_s < r.compute_s:
        # compute is timed in runs of its own: a step faster than it is noise, not a negative overhead
        return f"{1000 * r.step_s:.2f} = compute ({1000 * r.compute_s:.2f} alone) + overhead within noise"
    return f"{1000 * r.step_s:.2f} = {1000 * r.compute_s:.2f} + {1000 * r.overhead_s:.2f}"


def _ms(seconds):
    return f"{1000 * seconds:.2f} ms"


def explanations(rows):
    """One sentence per run with a breakdown: what dominates a worker's step, and what the
    distribution overhead is for this method (split where the backend measured its waiting)."""
    out = []
    for r in rows:
        if r.status != "ok" or r.step_s is None or r.compute_s is None:
            continue
        head = f"- {r.model or '-'}, {name_of(r)}, {r.workers} worker(s): "
        out.append(head + _step_sentence(r) + _details(r) + ".")
    return out


def step_parts(r):
    """[(what, seconds)] that add up to the measured step: compute, then the overhead, split into
    the measured wait for the other workers and the rest where the run measured the wait.
    At one worker there is no peer: what the overhead is named says so (the method's wording,
    hvdps/methods.py)."""
    method, wait = r.method, r.wait_s
    names = method.overhead_parts(r.mode, r.workers == 1, wait is not None) if method else ["distribution"]
    parts = [("compute", r.compute_s)]
    if len(names) == 2:
        return parts + [(names[0], wait), (names[1], r.overhead_s - wait)]
    return parts + [(names[0], r.overhead_s)]


def _step_sentence(r):
    step, parts = r.step_s, step_parts(r)
    share = r.overhead_s / step         # the split's own terms: the recorded share is not needed
    if len(parts) == 2 and share <= 0:
        # compute is timed in its own runs, the step in the training loop: noise can put compute
        # above the step, and "72.89 ms of a 71.52 ms step" reads like a bug
        return (f"compute is the whole step: {_ms(r.compute_s)} timed on its own against a {_ms(step)} "
                f"step; distribution adds nothing measurable")
    if len(parts) == 2 and share < 0.1:
        return (f"compute dominates: {_ms(r.compute_s)} of a {_ms(step)} step; distribution "
                f"adds {100 * max(share, 0):.0f}%")
    top = max(parts, key=lambda p: p[1])
    others = [p for p in parts if p is not top]
    said = "; ".join(f"{p[0]} {100 * p[1] / step:.0f}% ({_ms(p[1])})" for p in others)
    return (f"{100 * top[1] / step:.0f}% of each step ({_ms(top[1])} of {_ms(step)}) is {top[0]}, the largest "
            f"part; {said}")


INPUT_BOUND = 0.3    # a step that waits this share of itself for its batch is bound by its input,
INPUT_FLOOR_S = 1e-3  # when the wait is also longer than the iterator call itself (0.2-0.6 ms here, in memory)


def _details(r):
    text, method = "", r.method
    if r.exchange_s is not None:
        text += f"; measured inside {method.exchange_timed if method else 'its exchange'}: {_ms(r.exchange_s)}"
    if r.input_s is not None and r.input_share is not None:
        text += (f"; compute includes waiting for the next batch: {100 * r.input_share:.0f}% of the step "
                 f"({_ms(r.input_s)})")
        if r.input_share >= INPUT_BOUND and r.input_s >= INPUT_FLOOR_S:
            text += (": input-bound (the input, not the exchange, bounds this step): give tf.data more files to "
                     "read at once (hvdps data --shards), cheaper records (smaller or PNG images), or more "
                     "cores per worker")
    if r.bytes_per_step_per_worker:
        text += f"; {r.bytes_per_step_per_worker:,.0f} bytes on the wire per worker step"
    text += method.details(r) if method else ""
    if r.oversubscribed:
        text += " (oversubscribed: contention included)"
    return text


BOOTSTRAP_SAMPLES = 4000


def differ(a, b, higher_is_better=True):
    """Whether configuration ``a`` beats ``b`` across their runs, with the reason in words:
    (True, why) when the runs' ranges do not overlap, or a bootstrap 95% interval of the ratio of
    their medians excludes 1; (False, why) when neither; (None, why) when either has fewer than
    two runs (one run: no spread between runs to judge by). The ratio is the one the verdict
    states, how many times better ``a`` is: a's throughput over b's, b's time over a's."""
    xs, ys = _figures(a, higher_is_better), _figures(b, higher_is_better)
    if xs is None or ys is None or len(xs) < 2 or len(ys) < 2:
        return None, "one run"
    better, worse = (xs, ys) if higher_is_better else (ys, xs)
    apart = min(better) > max(worse)
    lo, hi = ratio_interval(better, worse)
    interval = f"bootstrap 95% interval of the ratio {lo:.2f}-{hi:.2f}"
    if apart:
        return True, f"the runs' ranges do not overlap; {interval}"
    if lo > 1:
        return True, interval
    return False, f"within the runs' spread: their ranges overlap and the {interval} holds 1"


def _figures(r, higher_is_better):
    if higher_is_better:
        return r.repeat_throughputs
    if r.repeat_times is None or any(t is None for t in r.repeat_times):
        return None
    return r.repeat_times


def ratio_interval(xs, ys, seed=0):
    """The 2.5th and 97.5th percentiles of median(xs*)/median(ys*) over resamples of each with
    replacement: seeded, so a report rebuilt from the same runs says the same."""
    rng = np.random.RandomState(seed)
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    num = np.median(x[rng.randint(0, len(x), (BOOTSTRAP_SAMPLES, len(x)))], axis=1)
    den = np.median(y[rng.randint(0, len(y), (BOOTSTRAP_SAMPLES, len(y)))], axis=1)
    ratios = num / den
    return float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))
