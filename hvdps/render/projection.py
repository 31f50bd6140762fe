"""The projection rendered: its table, its two-panel plot, the measured-against-projected table."""
import dataclasses
import json
import textwrap

from common.base.files import write_atomic
from hvdps import methods


def table(rows):
    archs = list(dict.fromkeys(r.arch for r in rows))
    by = {(r.workers, r.arch): r for r in rows}
    lines = ["| workers | " + " | ".join(f"{a} eff. (step ms)" for a in archs) + " |",
             "|---|" + "---|" * len(archs)]
    for n in sorted({r.workers for r in rows}):
        cells = [f"{100 * by[(n, a)].efficiency:.0f}% ({1e3 * by[(n, a)].step_s:.0f})" for a in archs]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows, path, title):
    """A panel per family of the rows (each cost model's ``panel``: ring all-reduce, parameter servers),
    in the order they first appear, so no family's lines hide another's; the curves with an overlap
    measured in the user's runs are dashed beside the schedule's."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    archs = list(dict.fromkeys(r.arch for r in rows))
    family = {r.arch: r.family for r in rows}
    families = [(name, [a for a in archs if family[a] == name]) for name in dict.fromkeys(family.values())]
    fig, axes = plt.subplots(1, len(families), figsize=(6 * len(families), 4.5), squeeze=False, sharey=True)
    workers = sorted({r.workers for r in rows})
    for (family, members), ax in zip(families, axes[0]):
        curves = {}                  # identical curves drawn once, their names joined
        for arch in members:
            rs = [r for r in rows if r.arch == arch]
            key = tuple((r.workers, round(r.efficiency, 4)) for r in rs)
            curves.setdefault(key, []).append(arch)
        for key, names in curves.items():
            ax.plot([w for w, _ in key], [e for _, e in key], "--" if all("overlap of" in a for a in names) else "-",
                    marker="o", label=_joined_label(names), markersize=3)
        ax.set_xscale("log", base=2)
        ax.set_xticks(workers, [str(w) for w in workers])
        ax.set(xlabel="workers", ylabel="projected scaling efficiency", ylim=(0, 1.05), title=f"{family}: {title}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)


def _joined_label(names):
    """One legend entry for curves that coincide: 'PS k=1 (overlap of ps async x1: 0%)' and
    '... x2: 0%)' become 'PS k=1 (overlap of ps async x1, ps async x2: 0%)', wrapped to fit."""
    heads = {n.split(" (overlap of ")[0] for n in names}
    if len(names) > 1 and len(heads) == 1 and all(" (overlap of " in n for n in names):
        inner = [n.split(" (overlap of ", 1)[1].rstrip(")") for n in names]
        tails = {i.rsplit(": ", 1)[-1] for i in inner}
        if len(tails) == 1:
            names = [f"{heads.pop()} (overlap of {', '.join(i.rsplit(': ', 1)[0] for i in inner)}: {tails.pop()})"]
    return textwrap.fill(" = ".join(names), 48)


def dumps(obj):
    """projection.json: the typed networks (AlphaBeta) as their fields."""
    def plain(x):
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return dataclasses.asdict(x)
        raise TypeError(f"not JSON serializable: {type(x).__name__}")
    return json.dumps(obj, indent=2, default=plain)


# ------------------------------------------------------------ runs as inputs
def _size(nbytes):
    """A gradient's size in the unit that shows it (a 30 kB MLP is not "0.0 MB")."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} bytes"


def check_table(rows):
    out = ["| run | backend | mode | workers | other tasks | measured step (ms) | projected (ms) | measured / projected | model |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.run} | {r.backend} | {r.mode or '-'} | {r.workers} | {methods.tasks_said(r.backend, r.tasks) or '-'} | "
                   f"{1e3 * r.measured_step_s:.1f} | {1e3 * r.projected_step_s:.1f} | {r.ratio:.2f} | "
                   f"{r.how} |")
    return "\n".join(out)


def replay_table(rows, trusted=None):
    """Markdown: each method's step and efficiency replayed at every worker count from its largest
    run's timeline (hvdps/cost/replay.py: ``at_scale``), the projector trusted for it beside."""
    if not rows:
        return ""
    counts = sorted({r.workers for r in rows})
    lines = ["## Replayed at scale: each method's own run played again at n workers", "",
             "The largest run of each method, its ranks' logged steps replayed at n workers on the network "
             "above, each on a host of its own, with its method's fit (factor x the cost model's exchange + "
             "offset). Step in ms (efficiency).", "",
             "| method | from | " + " | ".join(f"n = {n}" for n in counts) + " | trusted |",
             "|---|---|" + "---|" * len(counts) + "---|"]
    for method in dict.fromkeys(r.method for r in rows):
        mine = {r.workers: r for r in rows if r.method == method}
        first = next(iter(mine.values()))
        cells = [f"{1e3 * mine[n].step_s:.1f} ({mine[n].efficiency:.0%})" if n in mine else "-" for n in counts]
        trust = (trusted or {}).get(method, {}).get("projector", "-")
        lines.append(f"| {method} | {first.replayed_from} | " + " | ".join(cells) + f" | {trust} |")
    lines += [""] + [f"- {method}: {t['projector']} trusted, since {t['why']}." for method, t in (trusted or {}).items()]
    return "\n".join(lines) + "\n\n"
