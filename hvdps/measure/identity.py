"""One run's identity, built once when a comparison is planned (hvdps/commands/compare.py:
plan_runs), written with the run (compare_run.json's ``identity``) and read back typed, so that
everything else takes a run's identity from it rather than from its folder's name: the folder name
itself, which runs are repeats of one configuration (hvdps/measure/repeats.py: merge), which healthy
run an unhealthy one is held to, which one-worker run a run's scaling is measured against."""
import dataclasses
from dataclasses import dataclass
from typing import Optional, Tuple

from common.formats.schemas import RunIdentity
from common.spec import precision as precisions


def _label(text):
    """``text`` as a DNS label writes it: lower case, ``-`` for ``_``, ``p`` for a decimal point."""
    return str(text).lower().replace("_", "-").replace(".", "p")


def settings_text(settings):
    """A run's settings as the report, results.csv and ``--backends`` write them: ``NAME=VALUE,...``;
    "" for a run at its method's defaults."""
    return ",".join(f"{name}={value}" for name, value in settings)


def tasks_text(tasks):
    """A run's tasks besides its workers as the report, results.csv and ``hvdps hosts --tasks`` write
    them: ``ps=2`` (``chief=1,ps=2``); "" for a run of workers only."""
    return ",".join(f"{role}={n}" for role, n in tasks)


def workload_name(model, precision=None, jit_compile=False):
    """What a run's workload is called (its identity, the report's headings and panels): the model, its
    precision where that is not float32, and ``xla`` where XLA compiled its step (``transformer
    mixed_bfloat16 xla``), so that a comparison read back beside another keeps the two apart. ``auto`` is
    the policy it takes on this machine (common/spec/precision.py), as each trainer here resolves it."""
    if precision == precisions.AUTO:
        precision = precisions.choose(precisions.AUTO).policy
    parts = [model or "-", *([precision] if precision not in (None, "float32") else []),
             *(["xla"] if jit_compile else [])]
    return " ".join(parts)


@dataclass(frozen=True)
class RunId:
    """``tasks``: ((role, count), ...) the job starts besides its workers, as its method's launcher
    names them (``Launcher.task_choices``); ``settings``: ((name, value), ...) of the method's own
    knobs; ``condition``: the label of a slow or stalled worker or a slow link, None healthy;
    ``repeat``: k of ``--repeat N``, None for a configuration that ran once."""
    workload: str
    method: str
    mode: str
    workers: int
    tasks: Tuple[Tuple[str, int], ...] = ()
    settings: Tuple[Tuple[str, str], ...] = ()
    condition: Optional[str] = None
    repeat: Optional[int] = None

    @property
    def name(self):
        """The run's folder name: mpi-sync-w2, ps-sync-w2-ps1-slow1x4-r2, horovod-sync-w2-cycle-time-ms-0p1.
        It is also the run's Kubernetes object name, so a setting is spelled as a DNS label spells it
        (``_`` as ``-``, ``.`` as ``p``)."""
        return (f"{self.method}-{self.mode}-w{self.workers}" + "".join(f"-{role}{n}" for role, n in self.tasks)
                + "".join(f"-{_label(k)}-{_label(v)}" for k, v in self.settings)
                + (f"-{self.condition}" if self.condition else "") + (f"-r{self.repeat}" if self.repeat else ""))

    @property
    def configuration(self):
        """The identity its repeats share: what --repeat's median is taken over."""
        return dataclasses.replace(self, repeat=None)

    @property
    def healthy(self):
        """Its healthy twin's identity: the same shape and repeat with no condition."""
        return dataclasses.replace(self, condition=None)

    @property
    def shape(self):
        """What its scaling is measured within: the workload, method, mode, settings, other tasks and
        condition, whatever the workers and the repeat."""
        return dataclasses.replace(self, workers=1, repeat=None)

    def record(self):
        return RunIdentity(workload=self.workload, method=self.method, mode=self.mode, workers=self.workers,
                           tasks=dict(self.tasks), settings=dict(self.settings), condition=self.condition,
                           repeat=self.repeat)

    @classmethod
    def of_record(cls, r):
        return cls(r.workload, r.method, r.mode, r.workers, tuple(r.tasks.items()), tuple(r.settings.items()),
                   r.condition, r.repeat)
