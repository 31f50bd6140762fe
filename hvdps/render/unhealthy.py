"""The report's answer for an unhealthy cluster (hvdps compare --straggler / --stall): each method
with a slow or stalled worker against the same method's healthy run, in the verdict, a section and
straggler.png.

Every figure is a ratio to the same method, workers and workload on the healthy cluster in the
same comparison, so the machine's own speed cancels: 0.25x is what a method keeps of itself. The
simple models beside them are the textbook ones: a synchronous method runs at the slowest
worker's pace (about 1/F of healthy throughput), asynchronous PS at the sum of its workers' rates
((N - 1 + 1/F) / N), and sync PS with backup workers as TensorFlow's SyncReplicasOptimizer plays
out: it hands each update's N tokens to whichever workers ask first, so a fast worker takes a late
one's, the summed rates at two workers and less with more (not the textbook backup worker, which
keeps the (N - K)-th fastest worker's pace); a stalled worker runs (every - for) / every of the
time. All of them come from one model, hvdps/cost/stragglers.py, which the projection uses too.
The all-reduce methods have no backups: every step waits for every rank."""
from hvdps import methods
from hvdps.cost import stragglers
from hvdps.measure.rows import kept_rates
from hvdps.render.plots import save_png
from hvdps.render.styles import name_of, series_styles


def healthy_of(rows):
    """{(workload, backend, mode, other tasks, workers): the healthy row} of every ok healthy run."""
    return {_key(r): r for r in rows if r.condition is None and r.status == "ok"}


def _key(r):
    return (r.model, r.backend, r.mode, r.tasks, r.settings, r.workers)


def _ratio(a, b):
    return a / b if a is not None and b else None


def _kept(r, h):
    """(healthy, run) samples/s as every figure here and the projection's measured share take them
    (hvdps/measure/rows.py: kept_rates): a stall's stops are in the samples over the whole interval."""
    return kept_rates(r, h, stalled=bool(r.unhealthy and r.unhealthy.stalled))


def _keep(r, h):
    """What ``r`` keeps of its healthy twin ``h``'s throughput, or None."""
    if h is None:
        return None
    healthy, run = _kept(r, h)
    return _ratio(run, healthy)


def _x(v):
    return "-" if v is None else f"{v:.2f}x"


def _simple(r):
    """What the textbook model expects of this run's throughput, as a fraction of healthy: the
    worker's pace as its record describes it (F, or a stall's share of the time), every other worker
    healthy, and the step as its method waits (hvdps/cost/stragglers.py)."""
    u = r.unhealthy
    if u is None or not (u.factor or u.every_ms and u.for_ms) or not r.workers or u.rank >= r.workers:
        return None
    if u.every_ms and u.for_ms:
        paces = stragglers.described(r.workers, stalled={u.rank: (u.every_ms, u.for_ms)})
    else:
        paces = stragglers.described(r.workers, slow={u.rank: u.factor})
    cost = r.method.cost
    return stragglers.kept(paces, cost.waits_for(r.mode, r.workers),
                           unwaited=lambda steps: cost.unwaited_step(r.mode, steps))


def pairs(rows):
    """[(unhealthy row, its healthy row or None)] in the rows' order."""
    healthy = healthy_of(rows)
    return [(r, healthy.get(_key(r))) for r in rows if r.condition is not None]


def verdicts(rows):
    """One paragraph per workload and condition: what each method keeps of its healthy throughput
    and how much longer it takes to the target; opens the report's verdict."""
    out = []
    groups = {}
    for r, h in pairs(rows):
        what = r.unhealthy.what if r.unhealthy else r.condition
        groups.setdefault((r.model, r.workers, what), []).append((r, h))
    for (model, n, what), members in groups.items():
        parts = []
        for r, h in sorted(members, key=lambda m: -(_keep(*m) or 0)):
            if r.status != "ok" or h is None:
                parts.append(f"{name_of(r, healthy=True)}: " + (f"no healthy run to compare with" if h is None
                                                                 else f"{r.status}" + (f" ({r.error})" if r.error else "")))
                continue
            keep = _keep(r, h)
            slower = _ratio(r.time_to_target, h.time_to_target)
            text = f"{name_of(r, healthy=True)} keeps {_x(keep)} of its healthy throughput"
            text += (f" and takes {_x(slower)} as long to the target" if slower is not None else
                     ", never reaching the target" if r.time_to_target is None and h.time_to_target is not None else "")
            parts.append(text)
        out.append(f"- **An unhealthy cluster**, {model}, {n} worker(s), {what}: " + "; ".join(parts) + ".")
    crossings = overtakes(rows)
    if crossings:
        out.append("- **With one worker slowed by F**: " + "; ".join(crossings) + ".")
    return out


def overtakes(rows):
    """Per workload and worker count, where a method that does not wait for every worker (async PS,
    sync PS with backups) overtakes one that does, by throughput, as one worker is slowed by F:
    ["PS async overtakes bare MPI at F = 2 (..)", ...]; "stays behind" up to the largest F run."""
    out = []
    healthy = healthy_of(rows)

    def own_rate(r):                             # as the run is held to its twin (the section's samples/s)
        return _kept(r, healthy.get(_key(r), r))[1]

    curves = {}                                  # (model, workers) -> {method: {F: samples/s}}
    for r in rows:
        if r.status != "ok" or not r.samples_per_sec_median:
            continue
        factor = 1.0 if r.condition is None else (r.unhealthy.factor if r.unhealthy else None)
        if factor is None:
            continue
        curves.setdefault((r.model, r.workers), {}).setdefault(name_of(r, healthy=True), {})[factor] = r
    for (model, n), by_method in curves.items():
        factors = sorted({f for c in by_method.values() for f in c})
        if len(factors) < 2:
            continue
        cost = lambda runs: next(iter(runs.values())).method.cost  # noqa: E731
        waits_all = {m for m, c in by_method.items() if cost(c).waits_for(next(iter(c.values())).mode, n) == n}
        for m in sorted(set(by_method) - waits_all):
            for other in sorted(waits_all):
                shared = [f for f in factors if f in by_method[m] and f in by_method[other]]
                rate = lambda who, f: own_rate(by_method[who][f])  # noqa: E731
                ahead = [f for f in shared if rate(m, f) > rate(other, f)]
                if not shared or (ahead and ahead[0] == shared[0]):
                    continue                     # ahead already when healthy: nothing to overtake
                where = f"{model}, {n} workers"
                if ahead:
                    f = ahead[0]
                    out.append(f"{m} overtakes {other} at F = {f:g} ({where}): {rate(m, f):,.0f} against "
                               f"{rate(other, f):,.0f} samples/s, where healthy it ran at "
                               f"{rate(m, shared[0]) / rate(other, shared[0]):.2f}x of {other}'s")
                else:
                    out.append(f"{m} stays behind {other} up to F = {shared[-1]:g} ({where})")
    return out


def _waits_for_all():
    """The methods whose every mode waits for every worker (hvdps/methods.py: ``waits_for``), by label."""
    return [m.label(m.modes[0]) for m in methods.METHODS.values()
            if all(m.cost.waits_for(mode, 4) == 4 for mode in m.modes)]


def section(rows):
    """Markdown: every unhealthy run beside its healthy one, with what was applied."""
    found = pairs(rows)
    if not found:
        return []
    lines = ["## An unhealthy cluster", "",
             "Each run with a slow or stalled worker, or a slow link, beside the same method's healthy run in this "
             "comparison. "
             "A slow worker runs in a CPU cgroup of its own whose quota is 1/F of the CPU each of the job's tasks "
             "gets when they share the machine evenly; a stalled one gets SIGSTOP and SIGCONT from the "
             "comparison. Both from the start of training; a slow link is its host's token bucket at the rate, from the "
             "launch (hvdps/measure/unhealthy.py), and `hvdps project --from` costs it held out. *Simple model*: a "
             "synchronous method at the slowest worker's pace (1/F of healthy throughput), asynchronous PS at "
             "its workers' summed rates ((N - 1 + 1/F) / N), and sync PS with K backup workers (`ps:backupK`) as "
             "TensorFlow's SyncReplicasOptimizer plays out: it hands each update's N tokens to whichever workers ask "
             "first, so a fast worker takes a late one's and pushes stale gradients, dropped (lost work); the summed "
             "rates at 2 workers, less with more, where a fast worker holding a stale token waits for the slow "
             f"one's push (ps_train/tokens.py). {', '.join(_waits_for_all())} have no backup workers: "
             "every step waits for every rank. *samples/s*: the median of the logging intervals with every worker in "
             "(the Runs table's median takes them all); under a stall, and for a method that exchanges once in several steps (local SGD), "
             "the samples over the whole measured interval, since the cost falls in the few intervals a stop or an "
             "exchange lands in (the healthy run beside it taken the same way; `hvdps project` takes the same "
             "figures).", "",
             "| workload | method | workers | condition | samples/s | vs healthy | simple model | time to target (s) "
             "| vs healthy | step p50 / p95 by rank (ms) | applied |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r, h in found:
        u = r.unhealthy
        applied = "-"
        if u is not None and u.rate_bps:
            applied = f"tc tbf: {u.link}'s link ({u.host}) at {u.rate}, both directions, for the run"
        elif u is not None and u.quota_us:
            applied = (f"{u.controller}: {u.quota_us:,} of {u.period_us:,} us per period, "
                       f"pid {', '.join(map(str, u.pids)) or 'not found'}")
        elif u is not None:
            applied = f"{u.stops} stops, {u.stopped_s:.1f} s stopped, pid {', '.join(map(str, u.pids)) or 'not found'}"
        simple = _simple(r)
        lines.append(f"| {r.model or '-'} | {name_of(r, healthy=True)} | {r.workers} | "
                     f"{u.what if u else r.condition} | {_fmt(_kept(r, h or r)[1])} | {_x(_keep(r, h))} | "
                     f"{_x(simple)} | {_fmt(r.time_to_target)} | "
                     f"{_x(_ratio(r.time_to_target, h and h.time_to_target))} | {_by_rank(r)} | {applied} |")
    return lines + [""]


def _by_rank(r):
    """Each rank's median and 95th-percentile step, as it timed its own steps (ranks/<task>.json)."""
    if not r.rank_steps:
        return "-"
    return ", ".join(f"{task} {1000 * q.p50:.2f} / {1000 * q.p95:.2f}" for task, q in r.rank_steps.items())


def write_ranks_plot(rows, out):
    """ranks.png: each rank's median and 95th-percentile step time in every unhealthy run and its
    healthy run, one panel per pair: who is slow, and who waits for it."""
    shown = [(r, h) for r, h in pairs(rows) if r.rank_steps and h is not None and h.rank_steps]
    if not shown:
        return None
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(shown), 1, figsize=(11, 3.2 * len(shown)), squeeze=False)
    for (r, h), (ax,) in zip(shown, axes):
        tasks = list(r.rank_steps)
        width = 0.2
        for k, (run, tag) in enumerate(((h, "healthy"), (r, r.unhealthy.what if r.unhealthy else r.condition))):
            steps = run.rank_steps
            xs = [i + (k - 0.5) * 2 * width for i in range(len(tasks))]
            ax.bar([x - width / 2 for x in xs], [1000 * steps[t].p50 if t in steps else 0 for t in tasks], width,
                   label=f"{tag}: median", color=f"C{2 * k}")
            ax.bar([x + width / 2 for x in xs], [1000 * steps[t].p95 if t in steps else 0 for t in tasks], width,
                   label=f"{tag}: 95th percentile", color=f"C{2 * k + 1}")
        ax.set_xticks(range(len(tasks)), tasks)
        ax.set(ylabel="ms per step (its own clock)", title=f"{r.model}, {name_of(r, healthy=True)}, {r.workers} workers")
        ax.grid(axis="y", alpha=0.3)
        # beside the panel, not on it: the last rank's bars reach the top of the panel they share
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_png(fig, out, "ranks.png")


def _fmt(v):
    return "-" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def write_straggler_plot(rows, out):
    """straggler.png: time to target and throughput relative to the same method's healthy run,
    against the slowdown factor (1: healthy), one line per method, one row per workload and
    worker count; None without slow-worker runs."""
    slow = [(r, h) for r, h in pairs(rows) if r.unhealthy and r.unhealthy.factor and h and r.status == "ok"]
    if not slow:
        return None
    import matplotlib.pyplot as plt
    panels = sorted({(r.model or "-", r.workers) for r, _ in slow})
    styles = series_styles(sorted({name_of(r, healthy=True) for r, _ in slow}))
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 3.6 * len(panels)), squeeze=False)
    for (model, n), (ax1, ax2) in zip(panels, axes):
        lines = {}
        for r, h in slow:
            if (r.model or "-", r.workers) == (model, n):
                lines.setdefault(name_of(r, healthy=True), [(1.0, 1.0, 1.0)]).append(
                    (r.unhealthy.factor, _ratio(r.time_to_target, h.time_to_target),
                     _keep(r, h)))
        for label, points in sorted(lines.items()):
            points.sort()
            colour, marker = styles[label]
            for ax, k in ((ax1, 1), (ax2, 2)):
                drawn = [(p[0], p[k]) for p in points if p[k] is not None]
                ax.plot([p[0] for p in drawn], [p[1] for p in drawn], f"{marker}-", color=colour, label=label)
        factors = sorted({p[0] for points in lines.values() for p in points})
        fine = [factors[0] + (factors[-1] - factors[0]) * i / 50 for i in range(51)]
        ax2.plot(fine, [stragglers.kept(stragglers.described(n, slow={n - 1: f}), n) for f in fine], ":",
                 color="grey", label="1/F (waits for every worker)")
        ax2.plot(fine, [stragglers.kept(stragglers.described(n, slow={n - 1: f}), None) for f in fine], "--",
                 color="grey", lw=1,
                 label=f"({n} - 1 + 1/F) / {n} (does not wait)")
        ax1.set(xlabel="slowdown factor F of one worker", ylabel="time to target / healthy",
                title=f"{model}, {n} workers: time to target")
        ax2.set(xlabel="slowdown factor F of one worker", ylabel="samples/s / healthy",
                title=f"{model}, {n} workers: throughput kept", ylim=(0, 1.15))
        for ax in (ax1, ax2):
            ax.set_xticks(factors)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    return save_png(fig, out, "straggler.png")
