"""Repeated runs of one configuration (``hvdps compare --repeat N``): the order they run in, the
configuration's row over its runs (whether two configurations differ across their runs: the
report's verdicts, hvdps/render/report.py).

One run cannot see a drift of the machine between runs: its 95% interval is over the logging
intervals of that run alone. So a configuration runs N times, in an order that alternates between
the methods (A B C, C B A, A B C ...: MLPerf runs each benchmark several times, BENCHMARKS.md
alternates pairs), so that a drift counts against each method in turn; the table takes the
median over the runs, and a difference is called real only when the runs show it.
"""
import dataclasses
import os
import statistics


def alternating(shapes, repeats):
    """[(k, shape)] in the order the runs go: the shapes in order, then reversed, and so on."""
    return [(k, shape) for k in range(1, repeats + 1)
            for shape in (shapes if k % 2 else list(reversed(shapes)))]


def configuration_of(row):
    """(the configuration's folder path, the row's repeat): from its identity (hvdps/measure/identity.py),
    the repeats of one configuration sharing the first; a run that is no repeat (or whose comparison
    did not record one) is a configuration of its own."""
    if row.identity is None or row.identity.repeat is None:
        return row.run_dir, None
    head = os.path.dirname(row.run_dir.rstrip(os.sep))
    return os.path.join(head, row.identity.configuration.name), row.identity.repeat


def merge(rows):
    """One row per configuration, in the order each first appears: a configuration that ran once is
    its run; one that ran N times is its median run by throughput with the figures a verdict reads
    (throughput, time to target, accuracy, wall time) replaced by their median over the runs that
    ended ok, each run's own figures kept in ``repeat_throughputs`` / ``repeat_times``."""
    groups = {}
    for r in rows:
        base, k = configuration_of(r)
        groups.setdefault(base, []).append((k, r))
    out = []
    for base, members in groups.items():
        if len(members) == 1 and members[0][0] is None:
            out.append(members[0][1])
            continue
        members.sort(key=lambda m: m[0] or 0)
        ok = [r for _, r in members if r.status == "ok" and r.samples_per_sec_median]
        failed = [f"r{k}" for k, r in members if r.status != "ok"]
        if not ok:
            out.append(dataclasses.replace(members[0][1], run_dir=base, repeats=len(members), repeats_ok=0))
            continue
        throughputs = [r.samples_per_sec_median for r in ok]
        middle = sorted(ok, key=lambda r: r.samples_per_sec_median)[(len(ok) - 1) // 2]
        times = [r.time_to_target for r in ok]
        reached = sorted(t for t in times if t is not None)
        # a run that never reached the target counts as slower than every run that did
        time = reached[(len(times) - 1) // 2] if len(reached) * 2 > len(times) else None
        median = lambda key: _median([getattr(r, key) for r in ok])
        row = dataclasses.replace(
            middle, run_dir=base, samples_per_sec_median=statistics.median(throughputs), time_to_target=time,
            final_test_accuracy=median("final_test_accuracy"), final_test_loss=median("final_test_loss"),
            wall_time=median("wall_time"),
            startup=dataclasses.replace(middle.startup, startup_s=_median([r.startup.startup_s for r in ok])),
            repeats=len(members), repeats_ok=len(ok), repeat_throughputs=throughputs, repeat_times=times,
            oversubscribed=any(r.oversubscribed for _, r in members),
            load=dataclasses.replace(middle.load, shared=_any(r.load.shared for _, r in members),
                                     others_cores=_most(r.load.others_cores for _, r in members),
                                     hypervisor_cores=_most(r.load.hypervisor_cores for _, r in members)))
        if failed:
            row = dataclasses.replace(row, error=f"{len(failed)} of {len(members)} runs did not end ok "
                                      f"({', '.join(failed)}): " + (next(r.error for _, r in members
                                                                        if r.status != "ok" and r.error) or "see its log"))
        out.append(row)
    return out


def _any(flags):
    """True if any run says so, False if every sampled run says not, None if none was sampled."""
    flags = [f for f in flags if f is not None]
    return any(flags) if flags else None


def _most(values):
    """The largest of the runs' figures that were measured; None if none was."""
    return max((v for v in values if v is not None), default=None)


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None
