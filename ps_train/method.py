"""What hvdps knows of the parameter-server methods this package trains (collected by
hvdps/methods.py): classic between-graph PS (``ps``, async and sync) and TensorFlow 2's
ParameterServerStrategy (``ps2``), both started by ``python -m ps_train.launch``, costed as
parameter servers, with the report's wording and the wait the sync trainer measures, the CPU its
tasks spend (``PSMethod.measures``) and the report's section on how the tasks split the model
(ps_train/report.py)."""
import dataclasses
import os
from dataclasses import dataclass
from typing import Optional, Tuple

from common.base.errors import UsageError
from common.formats.schemas import read_launch_record
from ps_train.cluster import check_aggregation, check_precision, jit_refusal
from hvdps.cost import fits, schedule
from hvdps.launchers import TaskFlag, TaskLauncher
from hvdps.cost.model import Network, Option, combine, summed_rates_step
from hvdps import methods
from hvdps.methods import Axis, Method
from ps_train.cluster import BACKUP, backups, base_mode
from ps_train.placement import place_ps
from ps_train.records import RECORDS
from ps_train import tokens
from ps_train.report import ps_details, shards_section
from common.base.numbers import whole


def _divides_gpus_per_server(towers, args):
    """A PS worker task drives GPUs of one server: their number divides the server's."""
    per_server = getattr(args, "gpus_per_server", 1)
    if towers >= 1 and per_server % towers:
        return f"--ps_gpus_per_worker must divide --gpus_per_server ({per_server}), got {towers}"
    return None


# What the projection's PS schedule (hvdps/cost/schedule.py: ps_step) takes of the PS implementation.
OPTIONS = (
    Option("ps_sharding", str, "split",
           "how variables go to PS shards: split (hvdps' PS trainers: large variables cut into one piece "
           "per shard, then round robin), round_robin (replica_device_setter's default, whole variables) "
           "or greedy by bytes (tf_cnn_benchmarks)",
           field="placement", choices=schedule.PLACEMENTS, says="PS placement {}"),
    Option("ps_gpus_per_worker", int, 1,
           "GPUs driven by one PS worker task, which sums their gradients before the push and reads each "
           "variable once for them (tf_cnn_benchmarks' --num_gpus); default 1, one task per GPU as hvdps' "
           "PS trainer runs",
           field="towers", low=1, says="{} GPU(s) per PS worker task", check=_divides_gpus_per_server),
    Option("ps_bandwidth_gbps", float, None,
           "what the PS transport (TensorFlow's gRPC) really moves per process, in Gbit/s, when that is "
           "below the link's --bandwidth_gbps",
           field="ps_bandwidth", scale=1e9 / 8, low=1e-6, high=1e6, says="PS transport {:g} Gbit/s",
           network="ps"),
)


class ParameterServers:
    """Parameter servers: each worker pushes its gradient and pulls the weights every batch; a PS
    task carries its share of every worker's bytes (by the bytes it holds, header ``ps_shard_bytes``,
    else evenly). Synchronous: every worker pushes, then every worker pulls; asynchronous: each
    worker at its own pace, the busiest PS link shared by all."""
    collective = False
    arch = "PS k=1"
    network = "ps"
    # comm.json's push and pull rows (benchmarks/comm_bandwidth.py: ps-push, ps-pull), fitted one way each
    measured = Network("ps", "ps-", "PS push and pull", fit=fits.push_pull)
    polls = False            # gRPC's threads block while they wait
    # the link each term crosses, for a worker on a cluster whose links differ (hvdps/cost/stragglers.py):
    # its own pushes and pulls cross its own link; every worker's cross the PS hosts'
    link_terms = {"own link": "own", "PS link": "server"}
    lockstep_modes = ("sync",)   # the workers wait for each other's gradients before each update
    options = OPTIONS

    def lockstep(self, mode):
        """Sync workers compute at the same moment each step; async ones each at their own pace, and
        so do sync workers with backups (``backupK``): TensorFlow's SyncReplicasOptimizer hands each
        update's N tokens to whichever workers ask first, so a fast worker takes a late one's too.
        Not the textbook backup worker (Chen et al. 2016), where every worker starts each update."""
        return mode in self.lockstep_modes

    def waits_for(self, mode, workers):
        """How many workers' gradients an update waits for: all of them in sync mode; none
        asynchronously, each applying its own; none with K backups either, since every push takes
        one of the N tokens an update hands out, applied (N - K of them) or dropped as stale (K):
        the job makes an update per N pushes at its workers' summed rate, as asynchronous workers
        do, and a slow worker's share goes to the others. Measured: N pushes an update, healthy, with
        a slow or stalled worker and on a slow link (BENCHMARKS.md section 18)."""
        if not self.lockstep(mode):
            return None
        return workers

    def unwaited_step(self, mode, steps, terms=None):
        """Seconds an update round takes for workers at their own ``steps``: asynchronous, n steps at
        their summed rates; with K backups, the token queue played out (ps_train/tokens.py): the
        summed rates at two workers, slower with more, where a fast worker that drew a stale token
        waits at an empty queue for a slow one's push; and no faster than the chief's round trip
        between two updates (``apply_round_trip``, from worker 0's ``terms``)."""
        k = backups(mode)
        if k:
            return tokens.update_interval(steps, len(steps) - k, apply_round_trip(steps, terms))
        return summed_rates_step(steps)

    def steps_per_exchange(self, mode):
        """Every step pushes its gradient and pulls the weights."""
        return 1

    def wait_points(self, mode, workers):
        """A worker waits twice a step, for its push to be taken and for its pull."""
        return 2

    def continues_without(self, mode, workers, terms):
        """Seconds of a step the other workers' exchange goes on while one worker is stopped: their
        pushes through the PS link, (n - 1)/n of its push half, which a lock-step update waits for
        anyway; then the update waits for the stopped worker's push. Asynchronous workers never
        wait for it (``waits_for``: None)."""
        if workers < 2 or "PS link" not in terms:
            return 0.0
        return (workers - 1) / workers * terms["PS link"][1] / 2

    def predict_links(self, mode, roles, gradient, shard_bytes=None):
        dense, sparse = (getattr(gradient, k) or 0 for k in ("dense_bytes", "sparse_bytes"))
        hosts = {h: {"in": 0.0, "out": 0.0} for h in dict.fromkeys(roles.values())}
        workers = [h for t, h in roles.items() if t.startswith("worker:")]
        ps = {t: h for t, h in roles.items() if t.startswith("ps:")}
        model = dense + sparse
        total = sum((shard_bytes or {}).values())
        for task, ph in ps.items():
            share = (shard_bytes[task] / total) if total and task in (shard_bytes or {}) else 1 / len(ps)
            for wh in workers:
                if wh == ph:
                    continue
                moved = share * model
                for h in (wh, ph):
                    hosts[h]["out"] += moved
                    hosts[h]["in"] += moved
        return hosts

    def split_roles(self, roles):
        """(the PS tasks' hosts, the workers' hosts) of a job's {task: host}; TF2's coordinator
        (``chief``) is neither: it trains nothing and serves nothing."""
        servers = [h for t, h in roles.items() if t.startswith("ps:")]
        workers = [h for t, h in roles.items() if not t.startswith(("ps:", "chief:"))]
        return servers, workers

    def net(self, nets):
        """The latency and bandwidth the PS exchange is costed with: the PS network's fit."""
        return nets.get(self.network)

    def exchange_s(self, row, nets):
        grad, n, ps = row.grad_bytes_per_step, row.workers or 1, self.net(nets)
        if not grad or not ps:
            return None
        return schedule.ps_time(n, grad, ps.bandwidth, ps.alpha, num_ps(row.tasks))

    schedules = True        # the projection's generic PS rows are this model's schedule
    panel = "parameter servers"

    def generic_rows(self, layers, compute_s, n, nets, tuning, shards=(1, 8), per_server=1):
        """[(label, Scheduled)]: the projection's server architectures at n workers: a fixed number of
        PS shards each (``shards``), one PS per server (k = n / per_server, the layout that grows
        with the cluster), and BytePS-style summation servers, the ring's schedule on the link its k
        CPU servers leave each worker (BytePS, OSDI'20, section 3.1)."""
        ps = self.net(nets)
        rows = [(label, self.schedule(layers, compute_s, n, ps, tuning, shards=k, per_server=per_server))
                for label, k in [(f"PS k={k}", k) for k in shards] + [("PS, 1 per server", -(-n // per_server))]]
        rings = methods.scheduler(collective=True)
        ring = rings.net(nets)
        for label, k in (("BytePS k=n/2", max(1, n // 2)), ("BytePS k=n", n)):
            scaled = dataclasses.replace(ring, bandwidth=ring.bandwidth * schedule.byteps_link_scale(n, k))
            rows.append((label, rings.schedule(layers, compute_s, n, scaled, tuning)))
        return rows

    def tasks_at(self, shards):
        """The tasks of a job whose model is split over ``shards`` PS tasks (a shape no one ran)."""
        return (("ps", shards),)

    def shard_bytes_at(self, layers, grad, shards):
        """{PS task: the bytes it holds} of ``grad`` over ``shards`` PS tasks, by the trainers' split
        placement of ``layers`` (schedule.place_variables), evenly where the layers are not known."""
        if not layers:
            return {f"ps:{i}": grad / shards for i in range(shards)}
        loads, _ = schedule.place_variables(layers, shards, "split")
        return {f"ps:{i}": b for i, b in enumerate(loads)}

    def generic_exchange_s(self, n, grad, nets, shards=1, per_server=1):
        """The alpha-beta time of one push and one pull of ``grad`` bytes through ``shards`` PS tasks."""
        ps = self.net(nets)
        return schedule.ps_time(n, grad, ps.bandwidth, ps.alpha, shards, per_server)

    def schedule(self, layers, compute_s, n, net, tuning, shards=1, per_server=1):
        """One step on ``net`` as the PS schedule plays it out (schedule.ps_step): ``shards`` PS tasks,
        ``per_server`` GPUs a server, the variables placed and the GPUs grouped into worker tasks as
        this implementation's knobs say (``tuning.placement``, ``tuning.towers``: OPTIONS)."""
        return schedule.ps_step(layers, compute_s, n, net.bandwidth, net.alpha, shards, per_server, tuning.placement,
                                towers=tuning.towers)

    def projected_step(self, row, shard_bytes, layers, nets, tuning):
        """PS tasks on hosts of their own (hvdps compare's ``--ps_placement own``). Sync: push all,
        then pull all, through the busiest PS link (n·S/B each way) or a worker's own (M/B),
        whichever is slower: compute + 2·(max(nS, M)/B + alpha). Async: a worker pushes and pulls
        on its own link while the others do the same; the busiest PS link carries n·S each way
        per round: max(compute + 2·(M/B + alpha), n·S/B + alpha)."""
        terms = self.step_terms(row, shard_bytes, layers, nets, tuning)
        if terms is None:
            return None, None
        how = "push all, then pull all" if self.lockstep(row.mode) else "own link or busiest PS link"
        return combine(row.compute_s, terms), how

    def step_terms(self, row, shard_bytes, layers, nets, tuning):
        """{term: (with compute, seconds)}, the step being the longest (``combine``): a worker's own
        link (push M, then pull M, after its compute) and the busiest PS link (sync: every worker's
        push, then every pull, after the compute; async: n·S each way while the workers compute)."""
        n, grad = row.workers, row.grad_bytes_per_step
        if not grad:
            return None
        shards = (shard_bytes or {}).values()       # {PS task: model bytes it holds}, header ps_shard_bytes
        shard = max(shards) if shards else grad / num_ps(row.tasks)
        ps = self.net(nets)
        bw, alpha = ps.bandwidth, ps.alpha
        busiest = n * shard / bw
        own = (True, 2 * (grad / bw + alpha))
        if self.lockstep(row.mode):
            return {"own link": own, "PS link": (True, 2 * (busiest + alpha))}
        return {"own link": own, "PS link": (False, busiest + alpha)}


NUM_PS = TaskFlag("num_ps", "ps", "PS", "parameter-server tasks of PS runs; 1,2 runs each PS variant with 1 and with 2 "
                   "shards")


def num_ps(tasks):
    """The PS tasks of a job's ``tasks`` ({role: count} or its items: ``Launcher.task_choices``), 1 when not given."""
    return dict(tasks).get("ps", 1)


class PSLauncher(TaskLauncher):
    """``python -m ps_train.launch``: the PS tasks and the workers, here or across --hosts."""
    module = "ps_train.launch"
    placement = True
    graph_mode = True
    task_flags = (NUM_PS,)

    def roles(self, hosts, workers, tasks, placement):
        """The PS tasks, the workers and TF2's coordinator where ps_train.launch puts them."""
        placed = place_ps(hosts, workers, num_ps(tasks), placement, chief=self.coordinators > 0)
        return {f"{role}:{i}": h for role in ("ps", "worker", "chief") for i, h in enumerate(placed.get(role, []))}

    def tf_tasks(self, workers, tasks):
        return {"ps": num_ps(tasks), "worker": workers}

    def mode_argv(self, mode):
        extra = ["--backup_workers", str(backups(mode))] if backups(mode) else []
        return [f"--{base_mode(mode) or 'async'}", *extra]

    def launcher_argv(self, workers, mode, tasks):
        return ["--num_ps", str(num_ps(tasks)), "--num_workers", str(workers), *self.mode_argv(mode)]

    def jit_refusal(self):
        return jit_refusal("v1")

    def check_job(self, run):
        try:
            check_aggregation(run.workers, backups(run.mode), spell=lambda k: f"{run.method}:{BACKUP}{k}")
        except UsageError as exc:
            raise UsageError(f"run {run.name}: {exc}")


class PS2Launcher(PSLauncher):
    """TensorFlow 2's ParameterServerStrategy: the same launcher with ``--ps_api v2``; asynchronous
    only, and one more process, the chief that coordinates (it does not train)."""
    graph_mode = False
    trainer_flags = ("--ps_api", "v2")
    ends = "chief"               # the coordinator ends the job; it releases the PS tasks and workers
    coordinators = 1

    def check(self, cfg):
        check_precision("v2", cfg.precision)
        super().check(cfg)

    def jit_refusal(self):
        return jit_refusal("v2")

    def tf_tasks(self, workers, tasks):
        return {"chief": 1, **super().tf_tasks(workers, tasks)}

    def launcher_argv(self, workers, mode, tasks):
        return [*super().launcher_argv(workers, mode, tasks), *self.trainer_flags]


def _cpu_at(series, t):
    """CPU seconds of one process at Unix time ``t``, linear between the launcher's samples."""
    before = [p for p in series if p[0] <= t]
    after = [p for p in series if p[0] >= t]
    if not before or not after:
        return None
    (t0, c0), (t1, c1) = before[-1], after[0]
    return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)


def ps_cpu_seconds(run_dir, interval):
    """CPU seconds the PS tasks spent in the measured interval, from the local launcher's samples
    (launch.json's cpu_series); None when the run was not started by it or the samples do not
    cover the interval. Whole-process totals would count start-up and imports against a
    training-only time."""
    path = os.path.join(run_dir, "launch.json")
    if not interval or not os.path.lexists(path):
        return None
    series = read_launch_record(path).cpu_series
    total = 0.0
    for name, points in series.items():
        if not name.startswith("ps:"):
            continue
        a, b = _cpu_at(points, interval[0]), _cpu_at(points, interval[1])
        if a is None or b is None:
            return None
        total += b - a
    return total if series else None


def apply_round_trip(steps, terms):
    """Seconds the chief (worker 0) needs between two updates with backup workers: its queue runner's
    reply and next request cross its own link, each behind what of its own pull (the reply) or push
    (the request) is queued there. A transfer of p seconds (its ``own link`` term, push then pull:
    2p) busies each direction p of its step S, and a message that comes at a random moment of it
    waits p / 2 on average: 2 x (p / S) x (p / 2) = p^2 / S. Next to nothing on a fast link (the
    update's own pushes set the pace); on a slow one the round trip sets it (BENCHMARKS.md section 16).
    0 without worker 0's terms."""
    own = terms[0].get("own link") if terms else None
    if not own or not steps or steps[0] <= 0:
        return 0.0
    p = own[1] / 2
    return p * p / steps[0]


def wait_per_worker(steps):
    """Sync PS: each worker's mean wait for its token per step of its own, over the measured
    intervals (warm-up excluded, as the throughput); None without the records or across a reset."""
    marks = [s for i, s in enumerate(steps) if s.sync_wait_total_s is not None and s.worker_steps
             and (s.samples_per_sec is not None or
                  (i + 1 < len(steps) and steps[i + 1].samples_per_sec is not None))]
    if len(marks) < 2:
        return None
    first, last = marks[0], marks[-1]
    pairs = list(zip(first.sync_wait_total_s, last.sync_wait_total_s, first.worker_steps, last.worker_steps))
    if not pairs or len({len(first.sync_wait_total_s), len(last.sync_wait_total_s), len(first.worker_steps),
                         len(last.worker_steps)}) != 1 or any(w1 < w0 or n1 <= n0 for w0, w1, n0, n1 in pairs):
        return None
    return tuple((w1 - w0) / (n1 - n0) for w0, w1, n0, n1 in pairs)


def per_ps_bytes(header, summary):
    """Bytes one PS task carries per update: a worker's push and pull (the summary's wire bytes, by
    ps_wire) for every push an update takes, split evenly over the PS tasks. Sync: every worker's,
    N an update, with K backups too, since each of the update's N tokens takes a push, applied or
    dropped as stale (SyncReplicasOptimizer: ``ParameterServers.waits_for``); async: one. None where
    the run did not record the figures it comes from."""
    if summary is None:
        return None
    figures = [getattr(r, "bytes_per_step_per_worker", None) for r in (summary.breakdown, summary.wire)]
    per_worker = next((b for b in figures if b is not None), None)
    if per_worker is None or header is None or not header.mode or not header.world_size:
        return None
    pushes = header.world_size if base_mode(header.mode) == "sync" else 1
    return int(per_worker * pushes / num_ps(header.tasks))


@dataclass(frozen=True)
class PSMeasured:
    """What a PS run measures beyond every trainer's figures (``PSMethod.measures``): results.csv's
    PS columns, and what ps_train/report.py says of them."""
    wait_per_worker_s: Optional[Tuple[float, ...]] = None   # sync: each worker's mean wait for its token
    ps_cpu_s: Optional[float] = None            # CPU seconds the PS tasks spent in the measured interval
    ps_cpu_share: Optional[float] = None        # the same, as a share of one core per PS task
    dropped_gradients: Optional[int] = None     # sync: gradients pushed and never applied
    bytes_per_update_per_ps: Optional[int] = None   # what one PS task carries per update (per_ps_bytes)


MAX_BACKUPS = 1 << 10          # ps:backupK's bound, as the trainer's other counts of workers


class PSMethod(Method):
    """A parameter-server method: what it measures beyond every trainer's records is the CPU its PS
    tasks spent over the measured interval (the launcher samples it: launch.json) and, in sync mode,
    each worker's wait for its token (the trainer's step records). Classic PS's sync mode takes
    backup workers as a mode of its own, ``backupK``: an update averages the first N - K gradients."""

    def parse_mode(self, text):
        if "sync" in self.modes and text.startswith(BACKUP):
            k = text[len(BACKUP):]
            if whole(k) is None or not 1 <= whole(k) <= MAX_BACKUPS:
                raise UsageError(f"backend {self.name}:{BACKUP}K: K backup workers, a whole number from 1 to "
                                 f"{MAX_BACKUPS} (e.g. {self.name}:{BACKUP}1), got '{text}'")
            return f"{BACKUP}{whole(k)}"
        return super().parse_mode(text)

    def label(self, mode):
        k = backups(mode)
        return f"{super().label('sync')}, {k} backup" if k else super().label(mode)

    def modes_help(self):
        text = super().modes_help()
        if "sync" in self.modes:
            text += f"; {self.name}:{BACKUP}K sync with K backup workers (an update averages the first N - K)"
        return text

    def overhead_parts(self, mode, alone, measured_wait):
        return super().overhead_parts(base_mode(mode), alone, measured_wait)

    def measures(self, run_dir, curves, summary, interval):
        header = curves.header
        cpu = ps_cpu_seconds(run_dir, interval)
        share = cpu / ((num_ps(header.tasks) if header else 1) * (interval[1] - interval[0])) \
            if cpu is not None else None
        return PSMeasured(wait_per_worker_s=wait_per_worker(curves.steps), ps_cpu_s=cpu, ps_cpu_share=share,
                          dropped_gradients=getattr(summary, "dropped_gradients", None),
                          bytes_per_update_per_ps=per_ps_bytes(header, summary))

    def shard_bytes(self, header):
        return getattr(header, "ps_shard_bytes", None)

    def details(self, row):
        return ps_details(row)

    def all_in(self, step):
        """Each worker's applied batches, read from the PS at the logged update (``worker_steps``):
        asynchronous workers train without a late one, and backups update without it."""
        counts = getattr(step, "worker_steps", None)
        return not counts or all(n > 0 for n in counts)


METHODS = (
    PSMethod("ps", {"async": "PS async", "sync": "PS sync"}, PSLauncher, ParameterServers(),
           overhead={"async": "pushing gradients to and pulling weights from the parameter servers",
                     "sync": "the PS round trip and waiting for the slower workers' gradients before each update"},
           waits={"sync": ("waiting for the other workers' gradients and the update (measured at the token queue)",
                           "the PS round trip and the rest")},
           waits_alone=("the update on the PS before the token comes back (one worker: no one else to wait for)",
                        "the PS round trip and the rest"),
             sections=(shards_section,), records=RECORDS, measured=PSMeasured,
           # what hvdps tune searches: the modes (each trains differently) and the PS task count
           space=(Axis("mode", ("async", "sync", f"{BACKUP}1"), arithmetic=True), Axis("num_ps", ("1", "2")))),
    PSMethod("ps2", {"async": "PS v2 (TF2 strategy)"}, PS2Launcher, ParameterServers(),
           overhead={"async": "the coordinator's dispatch and the PS round trip"}, sections=(shards_section,),
             records=RECORDS, measured=PSMeasured, space=(Axis("num_ps", ("1", "2")),)),
)
