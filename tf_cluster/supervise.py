"""A local job of TensorFlow-runtime tasks (parameter servers, MultiWorkerMirrored workers): start each
task, prefix its output lines with its name, decide what a task's death means, and tear every task
down on exit, Ctrl-C, SIGTERM or a failure. The PS launcher (ps_train/launch.py) and the
MultiWorkerMirrored launcher (mwms_train/launch.py) run their tasks through it.
"""
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

from common.base.errors import UsageError
from common.base.procs import child_env

_PR_SET_PDEATHSIG = 1

def _die_with_parent():
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def _pump(name, stream, out, lock, errors):
    """Copy one role's output with its name in front; remember its first 'error:' line."""
    for line in iter(stream.readline, b""):
        text = line.decode(errors="replace")
        if text.startswith("error:"):
            errors.setdefault(name, text.strip())
        with lock:
            out.write(f"[{name}] {text}")
            out.flush()
    stream.close()


class Cluster:
    """The processes of one local cluster, and their orderly or forced end."""

    def __init__(self, tasks, trainer_args, env=None, out=sys.stdout, marker=None):
        self.tasks = tasks            # [(name, argv)]
        self.marker = marker.encode() if marker else None   # in a task's command line, not a remote shell's
        self.trainer_args = trainer_args
        self.env = env or {}
        self.out = out
        self.lock = threading.Lock()
        self.procs = {}
        self.threads = []
        self.cpu = {}
        self.cpu_series = {}          # PS roles: [[unix time, CPU seconds so far], ...] every SERIES_EVERY s
        self.errors = {}              # role -> its first 'error:' line

    def start(self):
        for name, argv, extra_env in self.tasks:
            env = dict(self.env or child_env(), **extra_env)
            cpus = env.pop("HVDPS_PIN_CPU", None)

            def prepare(cpus=cpus):
                _die_with_parent()
                if cpus is not None:
                    os.sched_setaffinity(0, {int(cpus)})
            # stdin: a pipe only this launcher holds; a remote task's tether ends the task when it closes
            p = subprocess.Popen(argv + self.trainer_args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, env=env, preexec_fn=prepare)
            self.procs[name] = p
            t = threading.Thread(target=_pump, args=(name, p.stdout, self.out, self.lock, self.errors),
                                 daemon=True)
            t.start()
            self.threads.append(t)

    def say(self, text):
        with self.lock:
            self.out.write(f"[launch] {text}\n")
            self.out.flush()

    def stop(self, grace=5.0):
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
            if p.stdin:
                try:
                    p.stdin.close()       # a remote task's tether ends it (ssh forwards no signal)
                except OSError:
                    pass
        deadline = time.monotonic() + grace
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for t in self.threads:
            t.join(timeout=2)

    def pids(self):
        return {name: p.pid for name, p in self.procs.items()}

    SERIES_EVERY = 0.5

    def sample_cpu(self):
        """CPU seconds (user+system) each role has used so far; kept after the role exits.

        The PS tasks' samples are also kept as a time series, so the report can take
        their CPU over the trainer's measured interval alone (ps_train/method.py: ps_cpu_seconds), not over
        the whole process with its start-up and TensorFlow import."""
        tick = os.sysconf("SC_CLK_TCK")
        now = time.time()
        for name, p in self.procs.items():
            try:
                if self.marker and self.marker not in open(f"/proc/{p.pid}/cmdline", "rb").read():
                    continue            # a remote shell (ssh), not the task: its CPU is not the task's
                fields = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()
                self.cpu[name] = (int(fields[11]) + int(fields[12])) / tick
            except (OSError, IndexError, ValueError):
                continue
            series = self.cpu_series.setdefault(name, []) if name.startswith("ps:") else None
            if series is not None and (not series or now - series[-1][0] >= self.SERIES_EVERY):
                series.append([round(now, 3), self.cpu[name]])


def describe_exit(name, rc):
    if rc is not None and rc < 0:
        try:
            return f"{name} was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"{name} was killed by signal {-rc}"
    return f"{name} exited with code {rc}"


def supervise(cluster, sync, timeout=None, chief_name="worker:0", interrupted=lambda: False):
    """Wait for the chief (worker:0, or chief:0 with TF2's strategy); decide what other roles'
    deaths mean. ``interrupted()`` true ends the wait with KeyboardInterrupt: the signal handler's own
    KeyboardInterrupt is lost when it lands in a finalizer (Python prints and drops an exception
    raised in ``__del__`` or a weakref callback), the flag it set is not.

    Returns (exit code, what ended the job, the role that ended it).
    """
    chief = cluster.procs[chief_name]
    started = time.monotonic()
    reported = set()
    while True:
        if interrupted():
            raise KeyboardInterrupt
        cluster.sample_cpu()
        code = chief.poll()
        others = [(name, p.poll()) for name, p in cluster.procs.items() if name != chief_name and name not in reported]
        if code:     # the chief failed: a PS (or sync worker) killed by a signal by now is the cause, not the chief
            cause = next(((name, rc) for name, rc in others
                          if rc is not None and rc < 0 and (name.startswith("ps:") or sync)), None)
            if cause:
                others, code = [cause], None
        if code is not None:
            break
        for name, rc in others:
            if rc is None:
                continue
            reported.add(name)
            if name.startswith("ps:") and rc == 0:
                cluster.say(f"{name} finished")   # released by the chief; the chief exits next
                continue
            if name.startswith("ps:") or (rc != 0 and sync):
                why = "a PS is gone" if name.startswith("ps:") else "sync training needs every worker"
                cluster.say(f"{describe_exit(name, rc)}; {why}: stopping the cluster")
                return (rc if rc and rc > 0 else 1), describe_exit(name, rc), name
            cluster.say(describe_exit(name, rc) + ("; async training continues without it" if rc else ""))
        if timeout and time.monotonic() - started > timeout:
            cluster.say(f"timed out after {timeout:.0f}s: stopping the cluster")
            return 124, "timeout", None
        time.sleep(0.1)
    # Chief finished: the PS tasks were told to exit, other workers stop at the same global step.
    # A failed chief gets no grace: nothing useful can happen after it.
    deadline = time.monotonic() + (30 if code == 0 else 0)
    while time.monotonic() < deadline and any(p.poll() is None for p in cluster.procs.values()):
        cluster.sample_cpu()
        time.sleep(0.1)
    for name, p in cluster.procs.items():
        if p.poll() is None:
            cluster.say(f"{name} still running after the chief finished: stopping it")
    who = "worker:0 (chief)" if chief_name == "worker:0" else chief_name
    return (code if code >= 0 else 1), describe_exit(who, code), chief_name


def run_cluster(cluster, sync, timeout=None, chief_name="worker:0"):
    """Start ``cluster``, supervise it (``supervise``) and stop every task, also on Ctrl-C or SIGTERM:
    (exit code, what ended the job, the role that ended it). The PS and the MultiWorkerMirrored
    launchers (mwms_train/launch.py) run their tasks through it."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    signals = []

    def on_signal(signum, frame):
        signals.append(signum)
        raise KeyboardInterrupt

    # Both explicitly: a launcher started in the background by a non-interactive shell inherits
    # SIGINT ignored, and Python then installs no KeyboardInterrupt handler of its own.
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        cluster.start()
        cluster.say("started " + ", ".join(f"{n} (pid {pid})" for n, pid in cluster.pids().items()))
        return supervise(cluster, sync, timeout, chief_name=chief_name, interrupted=lambda: bool(signals))
    except KeyboardInterrupt:
        cluster.say("interrupted: stopping the cluster")
        return 130, "interrupted", None
    finally:
        cluster.stop()
        for s, h in previous.items():
            signal.signal(s, h)


def refuse_chosen(args, chosen):
    """A launcher places every task itself: a task's own cluster flags or TF_CONFIG are usage errors."""
    for name in chosen:
        if getattr(args, name) is not None:
            raise UsageError(f"--{name} is chosen by the launcher; do not pass it")
    if os.environ.get("TF_CONFIG", "").strip():
        raise UsageError("TF_CONFIG is set: the launcher chooses the cluster itself; unset it")



def last_words(cluster, code, ended_by, why):
    """What a user reads last: what ended the job, then, if a task said why, its own ``error:`` line
    passed through whole on stderr (not wrapped in the launcher's line), as if the task were run alone."""
    cluster.say(f"exit code {code} ({ended_by})")
    if why and code not in (0, 130):
        print(why, file=sys.stderr, flush=True)
    return code
