"""The held-out check rendered: its summary and report section."""
from hvdps import methods
from hvdps.cost.heldout import TOLERANCE
from hvdps.cost.replay import mean_error, worst


def summary(entries):
    """(held, total) over the held-out entries: how many land within TOLERANCE."""
    held = [e for e in entries if e.held_out]
    return sum(TOLERANCE[0] <= e.ratio <= TOLERANCE[1] for e in held), len(held)


def section(entries, cores=None):
    """Markdown lines: the fitted factors, the held-out table and how many rows it holds."""
    if not entries:
        return []
    ok, total = summary(entries)
    where = f"the {cores} cores every emulated host shares" if cores else "no shared cores recorded"
    p = entries[0].overlap_p
    overlap = f"p = {p:g}" if p else "p = inf (the longest alone)"
    lines = ["## Held out: fitted at the two smallest worker counts, predicted at the others", "",
             "Per method and mode, a factor for each link term of its model, fitted on its runs (every shard "
             "count) at the two smallest worker counts, and per shard count the cores floor; every larger "
             "run is a prediction (hvdps/cost/heldout.py, docs/projection.md). Contended compute: compute x "
             f"max(1, n / cores) for lock-step methods, {where}. Two resources at once: the step is the "
             f"soft maximum (sum t**p) ** (1/p) of the terms and the cores floor, {overlap}, fitted with the "
             f"factors over every method. **{ok} of {total} held-out runs within "
             f"measured / predicted {TOLERANCE[0]:.2f}-{TOLERANCE[1]:.2f}.**", "",
             "| method | fitted at | link factors |", "|---|---|---|"]
    seen = set()
    for e in entries:
        key = (e.backend, e.mode, e.settings)
        if key not in seen:
            seen.add(key)
            lines.append(f"| {methods.label(*key)} | {', '.join(map(str, e.fitted_at))} workers | " +
                         ", ".join(f"{t} {f:.2f}" for t, f in e.factors.items()) + " |")
    lines += ["", "| run | workers | | measured (ms) | network model (ms) | longest | cores busy | cores floor (ms) | "
              "predicted (ms) | measured / predicted |", "|---|---|---|---|---|---|---|---|---|---|"]
    for e in entries:
        busy = f"{100 * e.cores_busy:.0f}%" if e.cores_busy is not None else "-"
        floor = f"{1e3 * e.floor_s:.1f}" if e.floor_s else "-"
        ratio = f"{e.ratio:.2f}"
        if e.held_out and not TOLERANCE[0] <= e.ratio <= TOLERANCE[1]:
            ratio = f"**{ratio}**"
        lines.append(f"| {e.run or '-'} | {e.workers} | {'held out' if e.held_out else 'fitted'} | "
                     f"{1e3 * e.measured_step_s:.1f} | {1e3 * e.modelled_step_s:.1f} | {e.binding} | {busy} | "
                     f"{floor} | {1e3 * e.predicted_step_s:.1f} | {ratio} |")
    return lines + [""]


def unhealthy_summary(entries):
    """(within TOLERANCE, total, mean |1 - measured / predicted|) over the unhealthy runs' entries."""
    if not entries:
        return 0, 0, None
    ok = sum(TOLERANCE[0] <= e.ratio <= TOLERANCE[1] for e in entries)
    return ok, len(entries), sum(abs(1 - e.ratio) for e in entries) / len(entries)


def unhealthy_section(entries, left_out=()):
    """Markdown lines: each run on an unhealthy cluster predicted from its healthy twin
    (hvdps/cost/stragglers.py), and how many land within TOLERANCE."""
    lines = ["## An unhealthy cluster, held out: each run predicted from its healthy twin", ""]
    if entries:
        ok, total, mean = unhealthy_summary(entries)
        lines += ["Each worker's own step is the method's model (its compute, at its pace, and its terms on its "
                  "own links); a step that waits for w workers takes the expected w-th fastest (order "
                  "statistics), asynchronous workers add their rates, and sync PS with backups plays its "
                  "token queue out, its updates no closer than the chief's round trip over its own link. "
                  "A worker in a CPU quota of q cores computes the probe's compute / q; one whose ranks spin while they wait also runs the rest "
                  "of its step that is not on the network at that pace, and waits for its quota's next period "
                  "each time its peers' data arrives, and one whose ranks block takes no less than its healthy "
                  "twin's CPU a step / q (ranks/<task>.json, where recorded); a stalled one runs the share of the run's measured interval it "
                  "was not stopped in (its recorded stops; (every - for) / every where they are not listed), and "
                  "in a job whose step waits for it each stop costs its length less what the others' exchange "
                  "does meanwhile. In a lock-step job whose ranks block (TensorFlow's ring, sync PS), the term "
                  "every worker waits for (the ring's exchange, the PS link) takes what the healthy twin's "
                  "measured step leaves after its compute, scaled as the model scales it where the condition "
                  "changes it. "
                  "Predicted = the healthy twin's measured samples/s x the model's healthy step / its step on "
                  "this cluster (hvdps/cost/stragglers.py, docs/projection.md); samples/s are the median of the "
                  "logging intervals that began with every worker in; for a stall, and for a method that exchanges once in several steps, "
                  "the samples over the whole measured interval by its time. "
                  f"**{ok} of {total} runs within measured / predicted {TOLERANCE[0]:.2f}-{TOLERANCE[1]:.2f}; "
                  f"mean |1 - measured / predicted| {mean:.1%}.**", "",
                  "| run | condition | method | waits for | healthy samples/s | samples/s | kept | model keeps | "
                  "predicted samples/s | measured / predicted |", "|---|---|---|---|---|---|---|---|---|---|"]
        for e in entries:
            waits = "none" if e.waits is None else f"{e.waits} of {e.workers}"
            lines.append(f"| {e.run} | {e.condition} | {methods.label(e.backend, e.mode)} | {waits} | "
                         f"{e.healthy_samples_per_sec:,.0f} | {e.measured_samples_per_sec:,.0f} | "
                         f"{e.kept_measured:.2f}x | {e.kept_model:.2f}x | {e.predicted_samples_per_sec:,.0f} | "
                         f"{e.ratio:.2f} |")
        lines.append("")
    if left_out:
        lines += ["Not predicted: " + "; ".join(f"{n} ({w})" for n, w in left_out) + ".", ""]
    return lines


def _fitted_error(entries, label):
    errs = [abs(e.ratio - 1.0) for e in entries if not e.held_out and _label(e) == label]
    return sum(errs) / len(errs) if errs else None


def _label(e):
    return e.backend if e.projector == "replay" else methods.label(e.backend, e.mode, e.settings)


def trusted(replays, links, others=()):
    """{method: {"projector", "why"}}: per method, the projector whose fit is closer to the runs it was
    fitted on (the held-out runs are not looked at; to 0.1%), the replay where they tie or only it
    fitted; ``others``: the methods replayed at scale without a held-out check, the replay trusted."""
    out = {}
    for label in dict.fromkeys(_label(e) for e in replays):
        mine, theirs = _fitted_error(replays, label), _fitted_error(links, label)
        if theirs is not None and mine is not None and round(theirs, 3) < round(mine, 3):
            out[label] = {"projector": "link terms",
                          "why": f"its fit is {100 * theirs:.1f}% from its fitted runs, the replay's {100 * mine:.1f}%"}
        else:
            out[label] = {"projector": "replay", "why": (
                f"its fit is {100 * mine:.1f}% from its fitted runs" +
                (f", the link terms' {100 * theirs:.1f}%" if theirs is not None else ", the link terms fitted none"))}
    for label in others:
        out.setdefault(label, {"projector": "replay", "why": "it replays the run's own steps; not checked "
                                                             "held out (runs at fewer than three worker counts)"})
    return out


def replay_section(replays, links=()):
    """Markdown lines: every run replayed from its method's fitted runs' timelines (hvdps/cost/replay.py)
    beside the link terms' prediction of it, the mean error of each over the held-out runs, and the
    projector trusted per method."""
    if not replays:
        return []
    link_of = {e.run: e for e in links}
    held = [e for e in replays if e.held_out]
    mean, far = mean_error(replays), worst(replays)
    link_held = [link_of[e.run] for e in held if e.run in link_of]
    link_mean = sum(abs(e.ratio - 1) for e in link_held) / len(link_held) if link_held else None
    lines = ["## Held out by replay: each run's ranks' steps played again at the other worker counts", "",
             "Each method's runs at the two smallest worker counts give its fit: the step each took beyond "
             "its slowest rank's ready (input + compute, from ranks/<task>.json) against its cost model's "
             "exchange, a factor and an offset; every larger run is the largest fitted run's logged steps "
             "replayed at its n, the slowest of n ranks drawn from the measured ranks' own steps "
             "(hvdps/cost/replay.py, docs/projection.md)."]
    if mean is not None:
        lines[-1] += (f" **Held out: mean |measured / predicted - 1| {100 * mean:.1f}% over {len(held)} runs, "
                      f"the furthest {100 * far:.1f}%**" +
                      (f"; the link terms' on the same runs, {100 * link_mean:.1f}%." if link_mean is not None
                       else "."))
    lines += ["", "| method | fitted at | factor | offset (ms) | trusted | why |", "|---|---|---|---|---|---|"]
    trust = trusted(replays, links)
    seen = set()
    for e in replays:
        if e.backend not in seen:
            seen.add(e.backend)
            t = trust[e.backend]
            lines.append(f"| {e.backend} | {', '.join(map(str, e.fitted_at))} workers | {e.factor:.2f} | "
                         f"{1e3 * e.offset_s:+.1f} | {t['projector']} | {t['why']} |")
    lines += ["", "| run | workers | | measured (ms) | replayed (ms) | measured / replayed | link terms: "
              "measured / predicted | replayed from |", "|---|---|---|---|---|---|---|---|"]
    for e in replays:
        other = link_of.get(e.run)
        lines.append(f"| {e.run} | {e.workers} | {'held out' if e.held_out else 'fitted'} | "
                     f"{1e3 * e.measured_step_s:.1f} | {1e3 * e.predicted_step_s:.1f} | {e.ratio:.2f} | "
                     f"{f'{other.ratio:.2f}' if other else '-'} | {e.replayed_from} |")
    return lines + [""]
