"""The report's figures: throughput, accuracy against time, the per-step breakdown."""
import math
import os

from common.base.files import write_atomic
from hvdps.render.styles import LEGEND_INSIDE, LEGEND_ROWS, name_of, series_styles, wrapped


def _save(fig, out, name, legend_size):
    """Grid and legend on every panel that has a labelled line; the PNG written; its name. A row of
    panels whose legend would hide its lines (more than LEGEND_INSIDE entries: an emulated pass has
    48 runs) gets one legend, its panels' entries once each, right of its last panel; the PNG
    grows to hold it."""
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
    runs = [r for r in rows if r.status == "ok" and r.step_s is not None and r.compute_s]
    if not runs:
        return None
    groups = _workloads(runs)
    fig, axes = plt.subplots(len(groups), 1, figsize=(max(6, 1.1 * max(map(len, groups.values())) + 3),
                                                     3.6 * len(groups)), squeeze=False)
    for (model, group), (ax,) in zip(groups.items(), axes):
        group = sorted(group, key=lambda r: (_label(r), r.workers))
        # a bar is 1.1 inch wide: a method's name wraps at word boundaries so its neighbours' stay legible
        labels = [wrapped(_label(r), 16) + f"\n{r.workers} worker(s)"
                  for r in group]
        compute = [1000 * min(r.compute_s, r.step_s) for r in group]
        overhead = [1000 * max(r.step_s - r.compute_s, 0.0) for r in group]
        wait = [min(1000 * max(r.wait_s or 0.0, 0.0), o) for r, o in zip(group, overhead)]
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
    return save_png(fig, out, "breakdown.png")


def save_png(fig, out, name):
    """The figure laid out and written whole as ``out/name`` at 100 dpi, then closed; its name."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    write_atomic(os.path.join(out, name), lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)
    return name


def _workloads(rows):
    """{workload: its rows}, in a stable order: one panel each in every plot."""
    out = {}
    for r in rows:
        out.setdefault(r.model or "-", []).append(r)
    return dict(sorted(out.items()))


def _label(r):
    return name_of(r)


def write_plots(rows, out):
    """throughput.png (throughput with its 95% interval, and scaling efficiency, against workers)
    and accuracy_vs_time.png: one row of panels per workload, so lines of different models never
    join, each panel titled with its workload; worker ticks are the worker counts run."""
    import matplotlib
    matplotlib.use("Agg")
    written = [_throughput_plot(rows, out), _accuracy_plot(rows, out)]
    stacked = write_breakdown_plot(rows, out)
    return written + ([stacked] if stacked else [])


def _throughput_plot(rows, out):
    import matplotlib.pyplot as plt
    groups = _workloads(rows)
    # one look per method across the workloads' panels (and per method and workers in accuracy_vs_time.png)
    styles = series_styles(sorted({_label(r) for r in rows if r.samples_per_sec_median and r.status == "ok"}))
    fig, axes = plt.subplots(len(groups), 2, figsize=(11, 3.6 * len(groups)), squeeze=False)
    for (model, rs), (ax1, ax2) in zip(groups.items(), axes):
        series = {}
        for r in rs:
            if r.samples_per_sec_median and r.status == "ok":
                series.setdefault(_label(r), []).append(r)
        drawn = 0
        for label, runs in sorted(series.items()):
            runs.sort(key=lambda r: r.workers)
            colour, marker = styles[label]
            ax1.errorbar([r.workers for r in runs], [r.samples_per_sec_median for r in runs],
                         yerr=[r.samples_per_sec_error or 0.0 for r in runs], fmt=f"{marker}-", capsize=4,
                         color=colour, label=label)
            eff = [(r.workers, r.scaling_efficiency) for r in runs if r.scaling_efficiency is not None]
            if eff:
                ax2.plot(*zip(*eff), f"{marker}-", color=colour, label=label)
                drawn += 1
        if not drawn:                                  # e.g. make emulate-scale: 2 workers and up
            ax2.text(0.5, 0.5, "no 1-worker run of this workload:\nscaling efficiency needs throughput(1)",
                     ha="center", va="center", transform=ax2.transAxes, color="grey")
        _throughput_axes(model, series, sorted({r.workers for r in rs}), ax1, ax2)
    return _save(fig, out, "throughput.png", legend_size=8)


def _throughput_axes(model, series, ticks, ax1, ax2):
    """Each axis holds every point: a log scale where the rates span more than 20x, scaling
    efficiency up to 1.2 at least (superlinear runs included)."""
    ax1.set(xlabel="workers", ylabel="samples/sec (median, 95% interval)", title=f"{model}: throughput")
    rates = [r.samples_per_sec_median for runs in series.values() for r in runs]
    if rates and max(rates) > 20 * min(rates):   # e.g. one worker with no link against shaped links:
        ax1.set_yscale("log")                      # a linear axis would flatten every multi-worker run
    effs = [r.scaling_efficiency for runs in series.values() for r in runs if r.scaling_efficiency is not None]
    ax2.set(xlabel="workers", ylabel="throughput(n) / (n x throughput(1))",
            ylim=(0, max([1.2] + [1.1 * e for e in effs])), title=f"{model}: scaling efficiency")
    for ax in (ax1, ax2):
        ax.set_xticks(ticks)


def _accuracy_plot(rows, out):
    import matplotlib.pyplot as plt
    groups = _workloads(rows)
    curve_label = lambda r: f"{_label(r)}, {r.workers} worker(s)"      # noqa: E731
    styles = series_styles(list(dict.fromkeys(curve_label(r) for r in sorted(rows, key=lambda r: (_label(r), r.workers))
                                        if r.curves.evals)))
    fig, axes = plt.subplots(len(groups), 2, figsize=(11, 3.6 * len(groups)), squeeze=False)
    for (model, rs), (ax1, ax2) in zip(groups.items(), axes):
        target = next((r.target_accuracy for r in rs if r.target_accuracy), None)
        shown = [r for r in sorted(rs, key=lambda r: (_label(r), r.workers))
                 if r.curves.evals]
        for r in shown:
            evals = r.curves.evals
            label = curve_label(r)
            colour, marker = styles[label]
            for ax, key in ((ax1, "accuracy"), (ax2, "loss")):
                points = [(e.wall_time, getattr(e, key)) for e in evals if getattr(e, key) is not None]
                ax.plot([t for t, _ in points], [v for _, v in points], f"{marker}-", ms=3,
                        color=colour, label=label)
        if target:
            ax1.axhline(target, color="grey", ls="--", lw=1, label=f"target {target:g}")
        ax1.set(xlabel="seconds since the trainer started", ylabel="test accuracy", title=f"{model}: accuracy vs time")
        ax2.set(xlabel="seconds since the trainer started", ylabel="test loss", title=f"{model}: loss vs time")
    return _save(fig, out, "accuracy_vs_time.png", legend_size=7)
