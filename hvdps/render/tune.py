"""hvdps tune's report: the verdict best against best beside defaults against defaults, each method's
best settings and its gain over its own defaults (the final's medians and the range of its
repeats), each method's search (the model's ranking and pruning, every halving trial), and the
final's own comparison report (final/report.md, written by hvdps compare's report)."""
import os

from common.base.files import make_dirs, write_atomic
from hvdps import methods
from hvdps.measure.repeats import merge
from hvdps.measure.runs import environment_of, runs_configs, with_scaling
from hvdps.render.report import write_report
from hvdps.render.styles import wrapped


def _rate(row):
    return f"{row.samples_per_sec_median:,.0f}" if row is not None and row.samples_per_sec_median else "-"


def _spread(row):
    """The range of its repeats' throughputs, where it has more than one."""
    rates = [x for x in (row.repeat_throughputs or []) if x] if row is not None else []
    return f"{min(rates):,.0f}-{max(rates):,.0f}" if len(rates) > 1 else "-"


def _tta(row):
    return f"{row.time_to_target:.1f}" if row is not None and row.time_to_target is not None else "not reached"


def _settings(candidate):
    v = candidate.variant
    parts = [f"{k}={x}" for k, x in v.settings]
    if v.mode != (methods.get(v.method).default_modes or methods.get(v.method).modes)[0]:
        parts.insert(0, f"mode {v.mode}")
    if v.tasks and methods.get(v.method).launcher.task_flags:
        parts.append(methods.tasks_said(v.method, v.tasks))
    if candidate.precision:
        parts.append(f"--precision {candidate.precision}")
    return ", ".join(parts) or "its defaults"


def _gain(m):
    if not m.best or m.defaults_row is None or not m.defaults_row.samples_per_sec_median:
        return "-"
    best, base = m.best[1], m.defaults_row
    text = f"{(best.samples_per_sec_median or 0) / base.samples_per_sec_median:.2f}x samples/s"
    if best.time_to_target and base.time_to_target:
        text += f", {base.time_to_target / best.time_to_target:.2f}x time to target"
    return text


def verdict_lines(tuned):
    """The two verdicts, each a sentence and a table row per method."""
    by_method = {m.method: m for m in tuned.methods}
    lines = []
    for title, ranked, by, best in (("best against best", tuned.best, tuned.best_by, True),
                                    ("defaults against defaults", tuned.defaults, tuned.defaults_by, False)):
        if not ranked:
            lines += [f"**{title[0].upper()}{title[1:]}:** no method finished.", ""]
            continue
        name = _name(by_method[ranked[0][0]], best)
        said = "; ".join(f"{_name(by_method[m], best)} {_figures(r)}" for m, r in ranked[1:])
        lines += [f"**{title[0].upper()}{title[1:]}, by {by}: {name} first, {_figures(ranked[0][1])}.**"
                  + (f" Then {said}." if said else ""), ""]
    return lines


def _figures(row):
    tta = f"{row.time_to_target:.2f} s to the target, " if row.time_to_target is not None else "not at the target, "
    return tta + f"{_rate(row)} samples/s"


def _name(m, best):
    if best and m.best:
        return m.best[0].label
    return m.defaults.label


def best_table(tuned):
    lines = ["| method | best settings | judged by | samples/s | repeats' range | time to target (s) | updates | "
             "defaults: samples/s | defaults: time to target (s) | gain over its defaults |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for m in tuned.methods:
        label = methods.get(m.method).label((methods.get(m.method).default_modes or methods.get(m.method).modes)[0])
        if m.failed:
            lines.append(f"| {label} | {m.failed} | | | | | | | | |")
            continue
        best = m.best[1] if m.best else None
        steps = f"{best.steps:,}" if best is not None and best.steps else "-"
        lines.append(f"| {label} | {_settings(m.best[0]) if m.best else '-'} | {m.judged_by} | {_rate(best)} | "
                     f"{_spread(best)} | {_tta(best)} | {steps} | {_rate(m.defaults_row)} | {_tta(m.defaults_row)} | "
                     f"{_gain(m)} |")
    return lines


def search_lines(tuned):
    """Each method's search: the probe, its fitted network, every candidate's prediction, pruning and trials."""
    lines = ["## Each method's search", ""]
    for m in tuned.methods:
        lines += [f"### {m.defaults.label}", ""]
        if m.failed:
            lines += [m.failed + ".", ""]
            continue
        p = m.probe
        net = (f"the cost model's network, fitted to the probe's step: {8 * m.net.bandwidth / 1e9:.2f} Gbit/s at "
               f"{1e6 * m.net.alpha:.0f} us" if m.net else "no compute measured (--probe_steps 0): nothing pruned")
        lines += [f"Probe ({p.name}): step {1e3 * (p.step_s or 0):.2f} ms, compute {1e3 * (p.compute_s or 0):.2f} ms; "
                  f"{net}. {len(m.candidates)} candidate(s).", ""]
        rungs = sorted({(t.rung, t.steps) for t in tuned.trials})
        head = "| candidate | predicted step (ms) | " + "".join(f"r{r} ({s} steps) samples/s | " for r, s in rungs)
        lines += [head + "final samples/s | final time to target (s) |",
                  "|---|---|" + "---|" * len(rungs) + "---|---|"]
        finals = dict(m.finals)
        for r in m.ranked:
            c = r.candidate
            cells = []
            for rung, steps in rungs:
                t = next((t for t in tuned.trials if t.candidate == c and t.rung == rung), None)
                cells.append(("-" if t is None else f"{t.samples_per_s:,.0f}" if t.samples_per_s else "failed"))
            pred = f"{1e3 * r.predicted_s:.2f}" if r.predicted_s else "-"
            name = c.entry + (f" --precision {c.precision}" if c.precision else "") + (" (defaults)" if c == m.defaults else "")
            if r.pruned:
                name += f": pruned, {r.pruned}"
            row = finals.get(c)
            lines.append(f"| {name} | {pred} | " + "".join(f"{x} | " for x in cells) +
                         f"{_rate(row) if c in finals else '-'} | {_tta(row) if c in finals else '-'} |")
        lines.append("")
    return lines


def _final_length(tuned):
    """How long the final's runs were: the flags' full length, or the last rung's steps where that is
    longer (tuner.final_steps), as steps a worker."""
    steps = sorted({r.curves.header.plan.get("worker_steps") for r in tuned.final_rows
                    if r.curves.header is not None and isinstance(r.curves.header.plan, dict)} - {None})
    if not steps:
        return "at full length"
    said = f"{steps[0]:,}" if len(steps) == 1 else f"{steps[0]:,}-{steps[-1]:,}"
    if steps[0] == max((t.steps for t in tuned.trials), default=0):
        return f"for the last rung's {said} steps a worker (at least as long as a trial: steady state)"
    return f"at full length ({said} steps a worker)"


def write_tune_report(tuned, out, args, trainer_args, workers, extra=()):
    """report.md (and tune.png, and final/'s comparison report) in ``out``; the verdicts' text. ``extra``:
    lines after the verdicts (hvdps/tune/scale.py: the finals at the cluster --for_workers names)."""
    make_dirs(out)
    if tuned.final_rows:
        raw = list(tuned.final_rows)
        write_report(with_scaling(merge(raw)), os.path.join(out, "final"), runs_configs(raw), environment_of(raw),
                     every_run=raw)
    top = verdict_lines(tuned)
    stages = {}
    for t in tuned.trials:
        stages[t.rung] = stages.get(t.rung, 0) + 1
    lines = ["# hvdps tune: each method at its best", "",
             f"{args.model} at {workers} workers; budget {args.budget:g} s; halving from {args.trial_steps} steps "
             f"({', '.join(f'{n} trial(s) at rung {r}' for r, n in sorted(stages.items())) or 'no halving trial'}); "
             f"the finalists and each method's defaults run {_final_length(tuned)} {tuned.repeats} time(s) in "
             f"alternating order.",
             "", *top, *best_table(tuned), "", "![each method at its defaults and at its best](tune.png)", ""]
    if tuned.stopped:
        lines += [f"The budget ended the search early ({tuned.stopped}): each kind's best so far went on.", ""]
    if tuned.final_rows:
        lines += ["The final runs' own comparison (every figure, plot and verdict of hvdps compare): "
                  "[final/report.md](final/report.md).", ""]
    lines += list(extra)
    lines += ["Each method's best, as a command line, an sbatch script and a Kubernetes manifest: [best/](best/)" +
              (f", for {getattr(args, 'for_workers', None)} workers." if extra else "."), ""]
    lines += search_lines(tuned)
    write_atomic(os.path.join(out, "report.md"), "\n".join(lines) + "\n")
    plot(tuned, out)
    return "\n".join(top + best_table(tuned) + list(extra))


def plot(tuned, out):
    """tune.png: each method's samples/s at its defaults and at its best (the final's medians), the
    repeats' range as error bars."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    done = [m for m in tuned.methods if m.best and m.defaults_row is not None]
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(done) + 2), 4))
    for i, m in enumerate(done):
        for j, (row, what) in enumerate(((m.defaults_row, "defaults"), (m.best[1], "best"))):
            rate = row.samples_per_sec_median or 0.0
            rates = [x for x in (row.repeat_throughputs or []) if x] or [rate]
            ax.bar(i + (j - 0.5) * 0.38, rate, width=0.36, color="#9e9e9e" if j == 0 else "#1f77b4",
                   yerr=[[rate - min(rates)], [max(rates) - rate]], capsize=3, label=what if i == 0 else None)
    ax.set_xticks(range(len(done)))
    ax.set_xticklabels([wrapped(m.defaults.label, 30) + "\nbest: " + wrapped(m.best[0].label, 30)
                        for m in done], fontsize=7)
    ax.set_ylabel("samples/s (median of the final's runs)")
    ax.set_title("Each method at its defaults and at its best")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    write_atomic(os.path.join(out, "tune.png"), lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)
