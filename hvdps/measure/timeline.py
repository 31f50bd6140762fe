"""A run's per-rank timeline: ``timeline.json`` in the Chrome trace event format (Perfetto,
chrome://tracing), from what every rank or task wrote of its own steps (``ranks/<task>.json``,
common/trainer/steptimes.py) and the run's breakdown.

One track per rank or task, one complete event ("ph": "X") per part of each logged step, laid end
to end so that the parts add up to the step as that rank measured it:

- ``input``: the wait for the batch at the iterator (measured on each rank);
- ``compute``: the step without the exchange: the step call minus the exchange where the method
  times its exchange itself (bare MPI's MPI_Allreduce, local SGD's averaging), else the compute
  the breakdown timed alone in the same job (common/model/probe.py), at most the rest of the step;
- ``exchange + waiting``: the rest: the exchange and the wait for the other workers, which one
  rank's clock cannot tell apart (a ring waits inside its all-reduce; sync PS at its token queue).

A rank whose step is slower than the others' shows as long compute; the others' as long
exchange + waiting: who waits for whom. Horovod's own ``HOROVOD_TIMELINE`` (its negotiation and
all-reduce per tensor) can be written beside it with the trainer's environment.
"""
import glob
import json
import os

from common.base.files import write_atomic
from common.formats.schemas import SchemaError, read_rank_file
from common.trainer.steptimes import RANKS_DIR
from common.base.numbers import whole

TIMELINE = "timeline.json"


def rank_files(run_dir, damaged=None):
    """{task: RankFile} of the run's ranks, in task order. A file that does not read is left out, and
    named in ``damaged`` (a list, when given) as "ranks/<file>: why", for the report to say so."""
    out = {}
    for path in sorted(glob.glob(os.path.join(run_dir, RANKS_DIR, "*.json"))):
        try:
            rank = read_rank_file(path)
        except SchemaError as exc:
            if damaged is not None:
                damaged.append(f"{RANKS_DIR}/{os.path.basename(path)}: {str(exc).split(': ', 1)[-1]}")
            continue
        out[rank.task] = rank
    return dict(sorted(out.items(), key=lambda kv: _order(kv[0])))


def _order(task):
    role, _, index = task.partition(":")
    return (role, whole(index) or 0)


def parts(span, compute_s=None):
    """[(name, start, seconds)] of one logged step, end to end from its start to its end."""
    _, start, end, input_s, exchange_s = span
    step = end - start
    waited = min(max(input_s or 0.0, 0.0), step)
    rest = step - waited
    if exchange_s is not None:
        compute = max(rest - exchange_s, 0.0)
    elif compute_s is not None:
        compute = min(compute_s, rest)
    else:
        compute = rest
    out, t = [], start
    for name, seconds in (("input", waited), ("compute", compute), ("exchange + waiting", rest - compute)):
        out.append((name, t, seconds))
        t += seconds
    return out


def trace(ranks, compute_s=None, name="run"):
    """The Chrome trace (a dict) of ``ranks`` ({task: RankFile}): one thread per task."""
    starts = [s[1] for r in ranks.values() for s in r.spans]
    if not starts:
        return None
    t0 = min(starts)
    events = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": name}}]
    for tid, (task, rank) in enumerate(ranks.items(), start=1):
        events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid,
                       "args": {"name": f"{task} ({rank.host}, pid {rank.pid})"}})
        for span in rank.spans:
            step = int(span[0])
            for part, start, seconds in parts(span, compute_s):
                begin, end = round((start - t0) * 1e6, 3), round((start + seconds - t0) * 1e6, 3)
                events.append({"ph": "X", "name": part, "cat": "step", "pid": 1, "tid": tid,   # end to end
                               "ts": begin, "dur": round(end - begin, 3), "args": {"step": step}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"t0_unix_s": t0, "compute_s": compute_s, "source": "hvdps ranks/*.json"}}


def write_timeline(run_dir, compute_s=None):
    """timeline.json beside the run's ranks, written by the comparison that ran it (a rebuild with
    --from reads, and writes only into its --out); its path, or None when no rank wrote spans."""
    ranks = rank_files(run_dir)
    doc = trace(ranks, compute_s, os.path.basename(run_dir.rstrip(os.sep)))
    if doc is None:
        return None
    path = os.path.join(run_dir, TIMELINE)
    write_atomic(path, json.dumps(doc, allow_nan=False))     # the rank files' schema bounds every time
    return path


WORKER_ROLES = ("rank", "worker")     # the tasks that train; a PS task serves, a chief or coordinator dispatches


def worker_index(task):
    """A training task's index ("rank:3", "worker:3" -> 3), or None for a serving or dispatching one."""
    role, _, index = task.partition(":")
    return whole(index) if role in WORKER_ROLES else None


def readies(ranks, compute_s=None, after_step=0):
    """((each worker's ready seconds, in task order) per logged step past ``after_step`` that every
    worker logged, or where no step number is common to them, each worker's k-th): from its step's start to its gradient being ready, the wait for its batch plus
    its compute as ``parts`` splits the step (hvdps/cost/replay.py replays them). ``ranks``:
    {task: RankFile} (``rank_files``)."""
    per = {}
    for task, rank in ranks.items():
        if worker_index(task) is None:
            continue
        steps = {}
        for span in rank.spans:
            if int(span[0]) > after_step:
                input_part, compute_part, _ = parts(span, compute_s)
                steps[int(span[0])] = input_part[2] + compute_part[2]
        per[task] = steps
    if not per:
        return ()
    common = sorted(set.intersection(*(set(s) for s in per.values())))
    if common:
        return tuple(tuple(per[t][k] for t in per) for k in common)
    # workers that number their steps apart (TF2's PS: the coordinator hands each step to whichever
    # worker is free): each one's k-th logged step together
    ordered = [[s[k] for k in sorted(s)] for s in per.values()]
    return tuple(zip(*ordered))


def run_readies(row):
    """``readies`` of a run (hvdps.measure.rows.RunRow): its workers' logged steps past its warm-up."""
    header = row.header
    warmup = (header.config.warmup_steps if header and header.config else 0) or 0
    start = (header.start_step if header else 0) or 0
    return readies(rank_files(row.run_dir), row.compute_s, warmup + start)
