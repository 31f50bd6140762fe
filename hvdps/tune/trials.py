"""A tune's trials: each a comparison's run of one candidate (hvdps/commands/compare.py: plan_run),
through its method's real launcher, on the cluster the flags ask for, in a folder of its stage
(OUT/trials/probe, OUT/trials/r0-s300, ..., OUT/final/runs) with its exact command (compare_run.json),
its settings and its metrics. A trial that finished says so (trial.json beside its records); one that
did not (a killed tune) is removed and run again, so --resume repeats no finished trial. Live, a
trial the budget has no time left for raises OutOfBudget; rebuilding a report, one that never ran does."""
import os
import shutil
import sys
import time
from dataclasses import dataclass, field, replace

from common.base.errors import UsageError
from common.base.files import write_atomic
from common.formats.schemas import TrialRecord, read_trial_record
from hvdps.measure.plan import plan_run
from hvdps.measure.identity import RunId
from hvdps.measure.jobs import execute
from hvdps.measure.runs import collect
from hvdps.tune.search import OutOfBudget

DONE = "trial.json"
FIRST_GUESS_S = 30.0      # a trial of a method nothing has been measured of yet


@dataclass
class Clock:
    """The wall-time budget (seconds) from the tune's start; what trials took, for the next estimate."""
    budget_s: float
    started: float = field(default_factory=time.monotonic)
    took: list = field(default_factory=list)      # (method, steps or None for a full run, seconds)

    def left(self):
        return self.budget_s - (time.monotonic() - self.started)

    def estimate(self, method, steps):
        """Seconds a trial of ``method`` at ``steps`` (None: full length) will take: what its like took,
        else the method's nearest, else any trial's, else a first guess."""
        for pick in (lambda m, s: m == method and s == steps, lambda m, s: m == method, lambda m, s: True):
            seen = [t for m, s, t in self.took if pick(m, s)]
            if seen:
                return sum(seen) / len(seen)
        return FIRST_GUESS_S


@dataclass
class Trials:
    """Runs (or reads back) the tune's trials. ``live``: run what has not finished (False: --from);
    ``reserve``: seconds the budget keeps for the final while halving runs."""
    out: str
    workload: object               # (precision) -> the workload's name (hvdps.measure.identity.workload_name)
    workers: int
    trainer_args: list
    condition: object = None
    remote: object = None
    links: object = None
    controller: object = None
    run_timeout: float = 900.0
    clock: Clock = None
    live: bool = True
    progress: object = None        # (candidate, stage, row) -> None: the progress line after each trial
    reserve: float = 0.0
    count: int = 0

    def plan(self, candidate, stage, steps=None, repeat=None):
        """The PlannedRun of ``candidate``'s trial in ``stage`` ("probe", "r0-s300", "final") at ``steps``
        (None: the flags' own length), its ``repeat`` in the final."""
        v = candidate.variant
        identity = RunId(self.workload(candidate.precision or None), v.method, v.mode, self.workers, tasks=tuple(v.tasks or ()),
                         settings=v.settings, condition=self.condition.label if self.condition else None,
                         repeat=repeat)
        folder = os.path.join(self.out, "final", "runs") if stage == "final" else os.path.join(self.out, "trials", stage)
        if candidate.precision:   # a workload of its own: its folder name is its method's, so a folder of its own too
            folder += "-" + candidate.precision.replace("_", "-")
        argv = list(self.trainer_args) + candidate.argv
        if steps is not None:     # so many steps; a rung's evaluated once, with no checkpoint on the way
            argv += ["--train_steps", str(steps)]
            if stage != "final":  # a final evaluates as the flags say: its time to the target is judged
                argv += ["--eval_every_epoch", "false", "--checkpoint_every_epoch", "false"]
        return plan_run(identity, self.condition, folder, argv, os.cpu_count() or 1, self.remote)

    def run(self, candidate, stage, steps=None, repeat=None, reserve=None):
        """The RunRow of the trial ``plan`` makes: read back where it finished, else run (live) within
        the budget, keeping ``reserve`` seconds (default: the final's) for later."""
        v = candidate.variant
        planned = self.plan(candidate, stage, steps, repeat)
        record = finished(planned.run_dir)
        if record is not None:
            if self.clock is not None:
                self.clock.took.append((candidate.method, steps, record.seconds))
            return collect([replace(planned, cmd=())])[0]
        if not self.live:
            raise OutOfBudget(f"{planned.name} did not run")
        keep = self.reserve if reserve is None else reserve
        if self.clock.estimate(v.method, steps) + keep > self.clock.left():
            raise OutOfBudget(f"{planned.name}: about {self.clock.estimate(v.method, steps):.0f} s, "
                              f"{max(0.0, self.clock.left()):.0f} s left")
        for leftover in (planned.run_dir, planned.run_dir + ".log"):       # a trial a killed tune left
            if os.path.isdir(leftover):
                shutil.rmtree(leftover)
            elif os.path.lexists(leftover):
                os.unlink(leftover)
        ran = execute([planned], self.run_timeout, [], progress=False, links=self.links, controller=self.controller)
        seconds = ran[0].outcome.seconds
        self.clock.took.append((v.method, steps, seconds))
        os.makedirs(planned.run_dir, exist_ok=True)
        write_atomic(os.path.join(planned.run_dir, DONE),
                     TrialRecord(entry=candidate.entry, stage=stage, steps=steps, seconds=seconds,
                                 exit_code=ran[0].outcome.returncode).model_dump_json())
        row = collect(ran, ran=True)[0]
        self.count += 1
        if self.progress:
            self.progress(candidate, stage, row, self.clock)
        return row



def finished(run_dir):
    """The trial's record where it finished (its trial.json reads as one), else None: a trial a
    killed tune cut off, or whose record is damaged, is run again."""
    path = os.path.join(run_dir, DONE)
    if not os.path.lexists(path):
        return None
    try:
        return read_trial_record(path)
    except UsageError:
        return None


def say(text):
    print(text, file=sys.stderr, flush=True)
