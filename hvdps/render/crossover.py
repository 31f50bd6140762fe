"""The crossover rendered: its report section and plot."""
from hvdps.cost.crossover import MAX_SHARDS
from common.base.files import write_atomic
from hvdps.render.styles import series_styles


def _ms(s):
    return "-" if s is None else f"{1e3 * s:.0f}"


def section(result, contended=()):
    """Markdown: per workload, where the ring overtakes one PS and the shards that match it.

    ``contended``: [(run, why)] of the runs that measured contention for the cores (shared,
    oversubscribed), named under the tables: a measured crossover resting on them says so."""
    if not result:
        return []
    lines = ["## Crossover: ring all-reduce against parameter servers", "",
             "At each worker count n, the fastest ring measured there against each PS variant: from which n "
             "the ring is faster than one PS, and the fewest PS shards whose step is no slower than the "
             "ring's. Measured: the runs; projected: the model above for the same shapes, each fed the "
             "compute its method measured at the nearest n (hvdps/cost/crossover.py). Step times in ms.", ""]
    for w in result:
        lines += [f"**{w.model}** ({w.grad_bytes / 1e3:.0f} kB of gradient per step), workers "
                  f"{', '.join(map(str, w.workers))}:", "",
                  "| PS variant | ring faster than one PS from n = (measured) | (projected) |", "|---|---|---|"]
        for v in w.variants:
            lines.append(f"| {v.ps} | {_from(v.ring_wins_from_measured)} | "
                         f"{_from(v.ring_wins_from_projected)} |")
        lines += ["", "| n | fastest ring | ring step: measured (projected) | PS variant | one PS: measured "
                  "(projected) | PS shards to match the ring: measured | projected |",
                  "|---|---|---|---|---|---|---|"]
        for v in w.variants:
            for b in v.by_n:
                shards = (str(b.shards_measured) if b.shards_measured else
                          f"more than {b.shards_measured_tried}" if b.shards_measured_tried else "-")
                lines.append(f"| {b.workers} | {b.ring or '-'} | {_ms(b.ring_measured_s)} "
                             f"({_ms(b.ring_projected_s)}) | {v.ps} | {_ms(b.ps1_measured_s)} "
                             f"({_ms(b.ps1_projected_s)}) | {shards} | "
                             f"{b.shards_projected or _none(b.closest_projected)} |")
        lines.append("")
    if contended:
        lines += ["The measured columns rest in part on runs that measured contention for the cores as well as "
                  "their method, so a measured crossover there is the machine's as much as the methods': " +
                  "; ".join(f"{name} ({why})" for name, why in contended) + ".", ""]
    return lines


def _none(best):
    return f"none up to {MAX_SHARDS}" + (f" (nearest: {best[0]}, at {best[1]:.2f}x the ring)" if best else "")


def _from(n):
    return "not in the range run" if n is None else str(n)


def plot(result, path):
    """crossover.png (``figure``) at ``path``; None without a workload to draw."""
    if not result:
        return None
    import matplotlib.pyplot as plt
    fig = figure(result)
    write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)
    return path


def figure(result):
    """One panel per workload: step time against workers, measured points over the model's lines
    (a colour and marker of its own per method and shard count, as the report's plots; rings
    solid, PS jobs dashed). A point measured under contention for the cores is hollow, and a line
    projected only from such runs dotted and pale, each said in the legend: the report's text leaves
    them out of its check, and the picture must not rank methods on them unsaid."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import ScalarFormatter
    fig, axes = plt.subplots(1, len(result), figsize=(9.5 * len(result), 5), squeeze=False)
    for w, ax in zip(result, axes[0]):
        looks = series_styles([s.name for s in w.series])
        handles = []
        crowded = False
        for s in w.series:
            (c, mark), style = looks[s.name], "-" if s.ring else "--"
            if s.projected:        # a line projected only from contended runs: dotted and pale
                ax.plot(*zip(*[(n, 1e3 * t) for n, t in s.projected]), ":" if s.contended_line else style,
                        color=c, linewidth=1, alpha=0.45 if s.contended_line else 1.0)
            clean = [p for p in s.measured if p not in s.contended]
            if clean:
                ax.plot(*zip(*[(n, 1e3 * t) for n, t in clean]), mark, color=c, markersize=5)
            if s.contended:        # measured under contention for the cores: hollow, not the method's
                ax.plot(*zip(*[(n, 1e3 * t) for n, t in s.contended]), mark, color=c, markersize=7,
                        markerfacecolor="none", alpha=0.6)
                crowded = True
            handles.append(Line2D([], [], color=c, linestyle=":" if s.contended_line else style, marker=mark,
                                  markersize=5, label=s.name + (" (from contended runs)" if s.contended_line else "")))
        if crowded:
            handles.append(Line2D([], [], color="grey", linestyle="none", marker="o", markerfacecolor="none",
                                  label="hollow: measured under contention for the cores\n(oversubscribed or "
                                        "shared): the machine's, not the method's"))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ticks = sorted({n for s in w.series for n, _ in s.projected + s.measured})
        ax.set_xticks(ticks, [str(n) for n in ticks])
        ax.set(xlabel="workers", ylabel="step time (ms)",
               title=f"{w.model}: measured (points) and projected (lines) step time")
        ax.grid(alpha=0.3, which="both")
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig
