"""What hvdps tune searches: each method's candidates, one ``Candidate`` per point of its axes
(``Method.space``, or the axes a ``--backends`` entry narrows: ``horovod[SETTING=V1|V2]``,
``ps:async|sync``), each a ``Variant`` as ``--backends`` would parse it, so a trial is a
comparison's run of that entry and its folder has that run's name."""
import itertools
from dataclasses import dataclass, replace

from common.base.errors import UsageError
from common.spec import precision as precisions
from hvdps import methods
from hvdps.methods import Axis, Variant, entry_text


@dataclass(frozen=True)
class Candidate:
    """One point of a method's space: its entry (``variant``), its arithmetic (``group``: the values
    of its axes that train differently, which only time to accuracy may compare across) and how many
    axes it moves away from the method's defaults (``changed``: a tie goes to the nearer); ``precision``,
    the policy it trains in where that is not the flags' own (precision_candidates), "" otherwise."""
    variant: Variant
    group: tuple = ()
    changed: int = 0
    precision: str = ""

    @property
    def argv(self):
        """The trainer flags it adds to the tune's own: its precision's."""
        return ["--precision", self.precision] if self.precision else []

    @property
    def method(self):
        return self.variant.method

    @property
    def entry(self):
        """The ``--backends`` entry that runs it (``NAME:MODE[SETTING=VALUE]``)."""
        return entry_text(self.variant)

    @property
    def label(self):
        """How the report names it: the method's label and its settings and tasks."""
        v = self.variant
        tasks = methods.tasks_said(v.method, v.tasks) if v.tasks and methods.get(v.method).launcher.task_flags else ""
        return (methods.label(v.method, v.mode, v.settings) + (f" ({tasks})" if tasks else "")
                + (f" in {self.precision}" if self.precision else ""))


def precision_candidates(cands, asked, hw=None):
    """Every method's precision as one more axis of its space: the defaults' candidate again in each
    mixed policy that the hardware computes natively (common/spec/precision.py) beside the one
    ``--precision auto`` chose, judged by time to the target accuracy (a policy trains differently).
    A policy the hardware would emulate is never a candidate (its trials would measure the emulation),
    and a ``--precision`` the flags name is kept as it is: ``cands`` is then returned unchanged."""
    if asked != precisions.AUTO or not cands:
        return cands
    hw = precisions.hardware() if hw is None else hw
    chosen = precisions.choose(asked, hw).policy
    others = [p for p in precisions.POLICIES if p != chosen and precisions.native(p, hw)]
    base = cands[0]
    return list(cands) + [replace(base, group=(*base.group, ("precision", p)), changed=base.changed + 1, precision=p)
                          for p in others]


def default_mode(method):
    return (method.default_modes or method.modes)[0]


def flag_counts(method, args):
    """{task flag dest: the count the flags give it first} (a PS count of 1): the defaults' tasks."""
    return {f.dest: str(getattr(args, f.dest)[0]) for f in method.launcher.task_flags}


def _listed(method):
    names = methods.axis_names(method)
    return f"{method.name} tunes {', '.join(names)}" if names else f"{method.name} has nothing to tune"


def _narrowed(method, item, modes_text, bracket):
    """The axes one entry gives (``MODE|MODE`` and ``NAME=V|V,...``), each value in its one spelling."""
    declared = {a.name: a for a in method.space}
    axes = []
    parts = ([("mode", modes_text)] if modes_text else []) + [
        tuple(x.strip() for x in p.partition("=")[::2]) for p in bracket.split(",") if p.strip()]
    for name, text in parts:
        if name not in methods.axis_names(method):
            raise UsageError(f"--backends {item}: {method.name} has no axis {name!r} ({_listed(method)})")
        if any(a.name == name for a in axes):
            raise UsageError(f"--backends {item}: {name} is given twice")
        values = [methods.axis_value(method, name, v.strip()) for v in text.split("|")]
        if not text.strip() or None in values:
            bad = next((v for v, p in zip(text.split("|"), values) if p is None), text)
            raise UsageError(f"--backends {item}: {bad.strip()!r} is not a value of {name} ({_listed(method)}; "
                             f"values are separated by '|')")
        axes.append(Axis(name, tuple(dict.fromkeys(values)), declared[name].arithmetic if name in declared
                         else name == "mode"))
    return axes


def parse_space(text):
    """{method name: [Axis]} of tune's --backends: ``NAME`` searches the method's declared space,
    ``NAME:MODE|MODE[AXIS=V|V,...]`` narrows (or sets) those axes, the others stay declared."""
    out = {}
    for item in methods.split_entries(text):
        head, bracket, rest = item.partition("[")
        if bracket and not rest.endswith("]"):
            raise UsageError(f"--backends {item}: axes go last, in one pair of brackets (NAME[:MODE|MODE][AXIS=V|V,...])")
        name, _, modes_text = head.strip().partition(":")
        method = methods.get(name)
        if name in out:
            raise UsageError(f"--backends names {name} twice (one entry per method; its values joined by '|')")
        given = _narrowed(method, item, modes_text, rest[:-1] if bracket else "")
        names = {a.name for a in given}
        out[name] = [*given, *(a for a in method.space if a.name not in names)]
    if not out:
        raise UsageError("--backends is empty")
    return out


def candidates(name, axes, args):
    """Every point of method ``name``'s ``axes``, the defaults first: a setting at its declared
    default is left out of the entry, so the defaults' candidate is the run a plain comparison makes."""
    method = methods.get(name)
    declared = {a.name: a.values[0] for a in method.space}
    declared["mode"] = default_mode(method)
    counts = flag_counts(method, args)
    declared.update(counts)
    roles = {f.dest: f.role for f in method.launcher.task_flags}
    out = [_candidate(method, {}, counts, roles, ())]
    for point in itertools.product(*(a.values for a in axes)):
        chosen = dict(zip((a.name for a in axes), point))
        group = tuple((a.name, chosen[a.name]) for a in axes if a.arithmetic and chosen[a.name] != declared.get(a.name))
        moved = {k: v for k, v in chosen.items() if v != declared.get(k)}
        c = _candidate(method, moved, counts, roles, group)
        if c.variant not in [x.variant for x in out]:
            out.append(c)
    return out


def _candidate(method, moved, counts, roles, group):
    settings = tuple((s.name, moved[s.name]) for s in method.settings if s.name in moved)
    tasks = tuple((roles[d], int(moved.get(d, counts[d]))) for d in roles)
    variant = Variant(method.name, moved.get("mode", default_mode(method)), settings, tasks or None)
    return Candidate(variant, group, len(moved))
