"""One bookkeeping for every backend: the same job logs, evaluates and checkpoints at the same global
updates, labels its epochs alike and ends with a breakdown, whoever runs it (common/trainer/bookkeeper.py)."""
import os
from types import SimpleNamespace

import pytest

from common.trainer.bookkeeper import Adapter, Bookkeeper, crossed
from common.spec.config import make_config
from tests.conftest import read_records
from common.spec.plan import make_plan
from tests.jobs import CKPT_STEPS, EPOCHS, LAUNCH, LOG_EVERY



# ---------------------------------------------------------------- the rule, in process
class FakeLog:
    def __init__(self):
        self.steps, self.evals, self.pauses, self.resumes, self.started = [], [], 0, [], 0

    def training_started(self):
        self.started += 1

    def step(self, step, loss, **extra):
        self.steps.append(step)

    def eval(self, epoch, step, loss, accuracy, **extra):
        self.evals.append((epoch, step))

    def paused(self):
        self.pauses += 1

    def resumed(self, step, samples_seen=None):
        self.resumes.append(step)

    def finish(self, steps, grad_bytes, **extra):
        self.summary = extra


class FakeAdapter(Adapter):
    def __init__(self):
        self.saves = []

    def evaluate(self, step):
        return 0.5, 0.9

    def save(self, step):
        self.saves.append(step)


def books(total_epochs=2, workers=1, per_update=1, chief=True, **cfg):
    cfg = make_config(epochs=total_epochs, log_every=cfg.pop("log_every", 10), **cfg)
    plan = make_plan(cfg, 1000, workers, per_update)      # 1000 examples, batch 32: 31 steps per epoch
    log, adapter = FakeLog(), FakeAdapter()
    return Bookkeeper(cfg, plan, SimpleNamespace(is_chief=chief), log, adapter), log, adapter, plan


@pytest.mark.unit
@pytest.mark.parametrize("prev, step, every, due", [
    (0, 10, 10, True), (9, 10, 10, True), (10, 19, 10, False), (18, 21, 10, True), (5, 35, 10, True),
    (0, 9, 10, False), (0, 100, 0, False), (7, 7, 1, False)])
def test_crossed_is_a_multiple_in_the_half_open_interval(prev, step, every, due):
    assert crossed(prev, step, every) is due


@pytest.mark.unit
@pytest.mark.parametrize("seen", [
    list(range(1, 63)),                                  # a synchronous loop sees every update
    [2, 3, 5, 8, 9, 11, 14, 17, 20, 21, 24, 27, 30, 32, 35, 38, 41, 44, 47, 50, 53, 56, 59, 62],   # async jumps
    [3, 6, 9, 31, 33, 62],                               # a stalled chief: several boundaries at once
])
def test_async_jumps_log_evaluate_and_checkpoint_at_the_boundaries_they_cross(seen):
    b, log, adapter, plan = books(checkpoint_steps=20, chief=False)
    b.backend.gradient_bytes = lambda model: 0
    assert plan.updates_per_epoch == 31 and plan.total_updates == 62
    for s in seen:
        b.after_update(s, 1.0)
    b.finish(62)
    # one log per crossed multiple of 10 (several crossed at once: one log), and the last update
    assert log.steps == [s for p, s in zip([0] + seen, seen) if s // 10 > p // 10 or s == 62]
    assert [e for e, _ in log.evals] == [1, 2]           # each epoch labelled once: the epoch that ended
    assert log.evals[0][1] == min(s for s in seen if s >= 31) and log.evals[1][1] == 62
    assert b.at("checkpoint") == [s for p, s in zip([0] + seen, seen) if s // 20 > p // 20 and s < 62] + [62]


@pytest.mark.unit
@pytest.mark.parametrize("final", [62, 64])               # 64: async workers in flight overshoot the end
def test_finish_evaluates_and_checkpoints_only_what_is_missing(final):
    b, log, adapter, plan = books(chief=False)            # not the chief: decisions only, no files
    b.backend.gradient_bytes = lambda model: 0
    for s in range(1, 61):                                # the chief saw 60 updates; the others made the rest
        b.after_update(s, 1.0)
    b.finish(final)
    assert log.evals == [(1, 31), (2, final)]             # the overshoot is still the last epoch
    assert log.steps[-2:] == [60, final]                  # a step record at the end, as in every loop
    assert b.at("checkpoint") == [31, final] and log.summary["checkpoints_at"] == [31, final]


@pytest.mark.unit
@pytest.mark.parametrize("cfg, seen, paused_at, resumed_at", [
    # each evaluation and each checkpoint, and the interval begins again at the next update
    ({"checkpoint_steps": 20}, range(1, 62), [20, 31, 40, 60], [21, 32, 41, 61]),
    ({"checkpoint_steps": 20}, [3, 25, 33, 52, 61], [25, 33, 52, 61], [33, 52, 61]),   # an async chief's jumps
    ({"eval_every_epoch": False, "checkpoint_every_epoch": False}, range(1, 62), [], []),   # logs alone
])
def test_the_throughput_meter_is_paused_after_each_evaluation_and_checkpoint(cfg, seen, paused_at, resumed_at):
    b, log, _, _ = books(**cfg)
    got = []
    for s in seen:
        before = log.pauses
        b.after_update(s, 1.0)
        got += [s] * (log.pauses - before)
    assert got == paused_at and log.resumes == resumed_at


@pytest.mark.unit
@pytest.mark.parametrize("cfg, seen, evals", [
    # every 25 updates as well as each epoch's end (31, 62): a corpus' epoch is thousands of steps
    ({"eval_every_steps": 25}, range(1, 62), [(1, 25), (1, 31), (2, 50), (2, 62)]),
    ({"eval_every_steps": 25, "eval_every_epoch": False}, range(1, 62), [(1, 25), (2, 50), (2, 62)]),
    ({"eval_every_steps": 25, "eval_every_epoch": False}, [3, 30, 61], [(1, 30), (1, 61), (2, 62)]),
    # ^ async jumps: 61 crossed epoch 1's end, so it is labelled the epoch that ended, as epoch-end evals are
    ({"eval_every_epoch": False}, range(1, 62), [(2, 62)]),                        # the end alone
])
def test_evaluations_every_n_updates_are_crossed_like_the_others(cfg, seen, evals):
    b, log, _, _ = books(chief=False, **cfg)
    b.backend.gradient_bytes = lambda model: 0
    for s in seen:
        b.after_update(s, 1.0)
    b.finish(62)
    assert log.evals == evals


@pytest.mark.unit
def test_training_starts_at_the_first_update_once_for_each_log():
    """Time to the target counts from the first update's end (MetricsWriter.training_started): told once
    to each log, and again to a log that replaces it (elastic Horovod's chief log, made after a reset)."""
    b, log, _, _ = books()
    assert log.started == 0
    for step in (1, 2, 3):
        b.after_update(step, 0.5)
    assert log.started == 1
    b.log = later = FakeLog()
    b.after_update(4, 0.5)
    b.after_update(5, 0.5)
    assert (log.started, later.started) == (1, 1)


@pytest.mark.unit
def test_only_the_chief_saves_but_every_rank_decides_alike():
    chief, _, saves_chief, _ = books(chief=True)
    other, _, saves_other, _ = books(chief=False)
    for s in range(1, 62):
        assert chief.after_update(s, 1.0) == other.after_update(s, 1.0)
    assert saves_chief.saves == [31] and saves_other.saves == [] and other.at("checkpoint") == [31]


@pytest.mark.unit
def test_elastic_epochs_are_told_by_the_loop():
    b, log, adapter, plan = books()
    for s in range(1, 41):                               # the world shrank: 40 updates made epoch 1
        b.after_update(s, 1.0, epoch=0)
    b.after_update(40, None, epoch=1)
    for s in range(41, 81):
        b.after_update(s, 1.0, epoch=0)
    b.after_update(80, None, epoch=2)
    assert log.evals == [(1, 40), (2, 80)] and adapter.saves == [40, 80]
    assert log.steps == [10, 20, 30, 40, 50, 60, 70, 80]


# ---------------------------------------------------------------- the same job under every backend
def _boundaries(every, total):
    return sorted({*range(every, total + 1, every), total})


@pytest.mark.process
@pytest.mark.parametrize("backend", [b for b in LAUNCH if b != "one process"])
def test_every_backend_keeps_the_same_books(jobs, backend):
    out = jobs(backend)
    records = read_records(os.path.join(out, "metrics.jsonl"))
    header, summary = records[0], records[-1]
    plan = header["plan"]
    total, per_epoch = plan["total_updates"], plan["updates_per_epoch"]
    assert total == EPOCHS * per_epoch
    logs = [r["global_step"] for r in records if r["type"] == "step"]
    evals = [(r["epoch"], r["global_step"]) for r in records if r["type"] == "eval"]
    ckpts = summary["checkpoints_at"]
    assert [e for e, _ in evals] == list(range(1, EPOCHS + 1))          # one label rule: 1..E, once each
    assert summary["breakdown"] and summary["wire"], summary              # a breakdown in every summary
    if backend != "ps async":                     # every update seen: exactly the boundaries
        assert logs == _boundaries(LOG_EVERY, total)
        assert [s for _, s in evals] == [per_epoch * e for e in range(1, EPOCHS + 1)]
        assert ckpts == _boundaries(CKPT_STEPS, total)
        return
    # async: the chief sees the global step jump by the other workers' updates (by how much
    # depends on scheduling: the other worker may start after the chief is done). It logs and
    # checkpoints at the first update it sees past each boundary, once however many one jump
    # crosses; the table tests above check that rule on given jumps, this that the records keep it.
    for seen, every in ((logs, LOG_EVERY), (ckpts, CKPT_STEPS)):
        inner = [s for s in seen if s < total]
        assert all(b // every > a // every for a, b in zip(inner, inner[1:])), (every, seen)
        assert all(s >= every for s in seen) and seen[-1] >= total, (every, seen)
    assert evals[0][1] >= per_epoch and evals[-1][1] >= total
