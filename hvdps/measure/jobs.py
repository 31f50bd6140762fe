"""Running a comparison's jobs one after another: each through its method's launcher, in a process
group of its own, with its worker slowed or stalled or its link shaped while it runs, its links and
the machine's load sampled, bounded by --run_timeout, stopped whole on a signal; each run's record
(compare_run.json) written beside it, and a failed run named by its own cause from its log."""
import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import time

from common.base.errors import RunError, UsageError
from common.base.files import make_dirs, open_new, write_atomic
from common.base.procs import REPO, child_env
from common.formats.schemas import RunRecord
from common.trainer.metrics import read_metrics
from hvdps.measure import reaper, unhealthy
from hvdps.measure.conditions import SlowLink
from hvdps.measure.links import Sampler
from hvdps.measure.load import LoadSampler
from hvdps.measure.runs import RUN_RECORD, Outcome
from hvdps.methods import get_launcher


def acting_on(run, pid, cores, controller, links=None):
    """What slows or stalls the run's worker, or slows its host's link (on hvdps emulate's cluster,
    ``links``), while its job ``pid`` runs (nothing for a healthy run)."""
    if run.condition is None:
        return contextlib.nullcontext()
    if isinstance(run.condition, SlowLink):
        return unhealthy.LinkShaper(run.condition, links)
    metrics = os.path.join(run.run_dir, "metrics.jsonl")     # the run's header: training has begun
    return unhealthy.Injector(run.condition, pid, get_launcher(run.backend).worker_of, cores, run.tasks,
                              run.name, controller, ready=lambda: os.path.exists(metrics))


def execute(runs, timeout, done, progress=True, links=None, controller=None):
    """Run each job in turn, appending each to ``done`` with its outcome (the one a signal stopped
    included, before the signal is raised on); a failure is recorded, never fatal. ``links``: sample
    the hosts' link counters while each job runs (hvdps.measure.links); every local job's and the
    machine's CPU is sampled (hvdps.measure.load). A run with a slow or stalled worker has it applied
    through ``controller`` (the CPU cgroup) while its job runs, and undone before the job is stopped."""
    with reaper.supervising():     # whatever ends this process, its jobs, groups and links end too
        return _execute(runs, timeout, done, progress, links, controller)


def _execute(runs, timeout, done, progress, links, controller):
    from tqdm import tqdm
    env, repo = child_env(), REPO
    bar = tqdm(runs, desc="runs", unit="run", disable=None if progress else True,  # None: off when not a TTY
               dynamic_ncols=True)
    for run in bar:
        bar.set_postfix_str(run.name)
        make_dirs(os.path.dirname(run.run_dir))
        if os.path.exists(os.path.join(run.run_dir, "metrics.jsonl")):
            raise UsageError(f"{run.run_dir} already holds a run; choose another --out")
        log_path = run.run_dir + ".log"
        started, launched_at = time.monotonic(), time.time()
        sampler = Sampler(links.counters, links.ports) if links else None
        stopped_by, timed_out = None, False
        token = reaper.job_token(run.name)
        reaper.tell(job=token)            # before it starts: a process of it is found by the token alone
        with open_new(log_path) as log:
            p = subprocess.Popen(list(run.cmd), stdout=log, stderr=subprocess.STDOUT,
                                 env={**env, **run.env, reaper.TOKEN: token}, cwd=repo, start_new_session=True)
            reaper.tell(job=token, group=p.pid)
            load = None if run.roles else LoadSampler(p.pid)    # across hosts: their cores, not ours
            acting = None
            try:
                with contextlib.ExitStack() as sampling:
                    acting = sampling.enter_context(acting_on(run, p.pid, os.cpu_count() or 1, controller, links))
                    for each in (sampler, load):
                        if each:
                            sampling.enter_context(each)
                    code, timed_out = _wait(p, run, timeout, bar)
            except Interrupted as exc:
                stopped_by = exc
                code = stop_job(p)
            except RunError:              # a condition that could not be applied or undone: no job left behind
                stop_job(p)
                raise
        reaper.tell(job_ended=token)
        seconds = time.monotonic() - started
        if os.path.isdir(run.run_dir):     # so a report rebuilt with --from still knows the start-up cost
            _save_records(run, seconds, launched_at, code, acting, sampler, links, load)
        error = _error_of(code, seconds, stopped_by, timed_out, timeout, log_path)
        done.append(dataclasses.replace(run, outcome=Outcome(code, seconds, launched_at, error, bool(stopped_by))))
        if stopped_by:
            bar.close()
            raise stopped_by
        bar.write(f"{run.name}: FAILED ({error})" if error else f"{run.name}: ok in {seconds:.0f}s")
    bar.close()
    return done


def _save_records(run, seconds, launched_at, code, acting, sampler, links, load):
    """Beside the run: compare_run.json, and the links' and the machine's samples."""
    record = run_record(run, seconds, launched_at, code, acting.applied if acting else None)
    write_atomic(os.path.join(run.run_dir, RUN_RECORD), record.model_dump_json(indent=2))
    if sampler:
        rates = dict(links.rates or {})
        if acting and acting.applied.rate_bps:          # a slow link: this run's rate on that host
            rates[acting.applied.host] = acting.applied.rate_bps
        sampler.save(run.run_dir, {"roles": dict(run.roles) if run.roles else None, "rate_bps": links.rate_bps,
                                   "rates": rates or None})
    if load:
        load.save(run.run_dir)


def _error_of(code, seconds, stopped_by, timed_out, timeout, log_path):
    """The run's one error line, or None: a signal, --run_timeout (with the run's last line), or its own cause."""
    if stopped_by:
        return f"interrupted by {stopped_by.name} after {seconds:.0f}s"
    if timed_out:
        last = _last_line(log_path)
        return f"error: stopped by --run_timeout after {timeout:g} s" + (f"; its last line: {last}" if last else "")
    if code != 0:
        return _last_error(log_path) or f"exit code {code}"
    return None


def run_record(run, seconds, launched_at, code, applied=None):
    """The run's compare_run.json as its reader's typed record, so what is written is what
    --from, the projection and the held-out check read back (common/formats/schemas.py: RunRecord)."""
    return RunRecord.model_validate(
        dict(seconds=seconds, launched_at=launched_at, exit_code=code, command=list(run.cmd),
             roles=dict(run.roles) if run.roles else None, oversubscribed=bool(run.oversubscribed),
             unhealthy=applied.to_dict() if applied else None,
             identity=run.identity.record().model_dump() if run.identity else None), strict=False)


def _wait(p, run, timeout, bar):
    """Wait for one job, showing its progress from the metrics file as it grows: (exit code, whether
    --run_timeout stopped it)."""
    deadline = time.monotonic() + timeout
    metrics = os.path.join(run.run_dir, "metrics.jsonl")
    while True:
        try:
            return p.wait(timeout=2), False
        except subprocess.TimeoutExpired:
            pass
        if os.path.exists(metrics):
            try:
                recs = read_metrics(metrics)
            except UsageError:      # the progress line only: the report reads the file again, and says why
                recs = []
            head = next((r for r in recs if r.type == "header"), None)
            last = next((r for r in reversed(recs) if r.type == "step"), None)
            if head and last:
                bar.set_postfix_str(f"{run.name} step {last.global_step}/{(head.plan or {}).get('total_updates')}")
        if time.monotonic() > deadline:
            stop_job(p)
            return 124, True


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP reached hvdps compare: stop the running job, report what finished."""

    def __init__(self, signum):
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(self.name)


def stop_job(p, grace=15.0):
    """End one job and everything in its process group: SIGTERM (launchers pass it on and
    clean up), then SIGKILL after ``grace`` seconds. Returns the job's exit code."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:                         # ranks or roles left in the group after its leader ended
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return p.returncode if p.returncode is not None else -signal.SIGKILL


def own_signals():
    """From here on SIGINT, SIGTERM and SIGHUP raise Interrupted; a second one while the job
    is being stopped is ignored, so the stop and the report are not cut short."""
    def handler(signum, frame):
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        raise Interrupted(signum)

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for s in previous:
        signal.signal(s, handler)
    return previous


def _last_line(log_path):
    """The run's last line of output (what it was doing when it was stopped), or None."""
    try:
        lines = [line.strip() for line in open(log_path, errors="replace").read().splitlines()[-50:]]
    except OSError:
        return None
    lines = [line for line in lines if line]
    return lines[-1][:300] if lines else None


def _last_error(log_path):
    try:
        lines = open(log_path, errors="replace").read().splitlines()
    except OSError:
        return None
    killed = [m for m in map(_RANK_SIGNAL.search, lines) if m]
    if killed:           # a rank that died by a signal is the cause; the others' errors follow from it
        rank, node, signum = int(killed[0].group(1)), killed[0].group(2), int(killed[0].group(3))
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        return f"rank {rank} killed by {name}" + (f" on {node}" if node else "")
    # hvdps's own lines first: a library's log line can hold "error:" too ("last error: UNKNOWN: ...
    # Connection refused" from gRPC, printed by a task still running as its cluster is stopped)
    own = [m.group(1) for m in map(_OWN_ERROR.match, lines) if m]
    causes = [line for line in own if not _LOST_PEER.search(line)]
    if own:              # a survivor's "lost rank N" follows from what that rank said, if it said anything
        return (causes or own)[-1]
    stopped = [m for m in map(_TASK_SIGNAL.search, lines) if m]
    if stopped:          # a launched task that died by a signal without a word (a crash in native code)
        return f"{stopped[-1].group(1)} killed by {stopped[-1].group(2)}"
    errors = [l[l.index("error:"):] for l in lines if "error:" in l]
    if errors:
        return errors[-1]
    return _mpi_banner(lines) or (lines[-1][-300:] if lines else None)


# Open MPI's word for a rank that died by a signal: "mpirun noticed that process rank 1 with PID 4242
# on node n1 exited on signal 9 (Killed)."
_RANK_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ (?:on node (\S+) )?exited on signal (\d+)")
# An "error: ..." line as hvdps prints it: alone, or behind a launcher's tag ("[chief:0] ",
# Open MPI's "[1,0]<stderr>:", srun --label's "0: ").
# The local PS and MWMS launchers' closing line for a task killed by a signal (tf_cluster/supervise.py:
# "[launch] exit code 1 (chief:0 was killed by SIGSEGV)").
_TASK_SIGNAL = re.compile(r"^\[launch\] exit code \d+ \((\S+) was killed by (SIG\w+|signal \d+)\)")
# A survivor's line about a rank it lost (allreduce/roster.py): a consequence, named only when no rank said why.
_LOST_PEER = re.compile(r": lost rank \d+ \(pid \d+ on ")
_OWN_ERROR = re.compile(r"^(?:\[[^\]]+\](?:<std\w+>:)?\s?|\d+:\s)?(error: .*)$")
_EXCEPTION = re.compile(r"^(\[\d+,\d+\]<std\w+>:)?[A-Za-z_.]*(Error|Exception|Exit)\b.*:")


def _mpi_banner(lines):
    """The opening sentence of the last message Open MPI framed in dashed lines ("There are not
    enough slots available ..."), or None: the frame itself says nothing."""
    rules = [i for i, l in enumerate(lines) if l.strip() and set(l.strip()) == {"-"} and len(l.strip()) > 20]
    if len(rules) < 2:
        return None
    first = next((l.strip() for l in lines[rules[-2] + 1:rules[-1]] if l.strip()), "")
    if first.startswith(("mpirun detected that one or more processes exited", "Primary job")):
        # mpirun's closing frame only says a rank failed: the rank's own exception line says why
        raised = [l.strip() for l in lines[:rules[-2]] if _EXCEPTION.match(l.strip())]
        if raised:
            return raised[-1][:300]
    words = []
    for line in lines[rules[-2] + 1:rules[-1]]:
        if not line.strip():
            if words:
                break
            continue
        words.append(line.strip())
    return " ".join(words)[:300] or None
