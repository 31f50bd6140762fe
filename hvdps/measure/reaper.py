"""What a comparison starts ends when the comparison ends, however it ends.

A SIGKILL cannot be caught, so the tie cannot be the comparison's own code. Before its first job,
hvdps compare (and hvdps tune) starts this supervisor (``supervising``): a process in a session of its
own, reading a pipe whose only writer is the comparison. The comparison tells it, one JSON line each,
every job it is about to start (the token its processes carry in their environment, ``TOKEN``, and
then its process group), every CPU group it makes for a slow worker, every link it slows, and when
each ends. When the pipe closes (the comparison exited, crashed, or was killed by any signal), the
kernel ends the supervisor's read, and it undoes whatever is still open:

- every process of an open job, found by its process group and by the token in /proc/<pid>/environ
  (the launchers' children inherit it, whatever session or group they make), is continued
  (SIGCONT: none is left stopped by a stall) and killed (SIGKILL), until none is left;
- every open CPU group is emptied into its hierarchy's root and removed;
- every slowed link is set back to its cluster's rate (tc, as hvdps/measure/cluster.py shapes it).

Then it exits. A comparison that ends normally closes each thing itself first, so the supervisor
finds nothing open. Run as ``python -m hvdps.measure.reaper``.
"""
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

from hvdps.measure import cluster

TOKEN = "HVDPS_JOB_TOKEN"      # in every job's environment: "<comparison pid>-<run name>"
KILL_S = 10.0                  # how long the supervisor keeps killing what a job left before it gives up

_ACTIVE = []                   # the comparison's supervisor while one runs


class Reaper:
    """The comparison's side: the supervisor process and the pipe it reads."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "hvdps.measure.reaper"], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, start_new_session=True, text=True,
                                     cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

    def tell(self, **message):
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):     # the supervisor is gone: nothing to tell
            pass

    def close(self, timeout=KILL_S + 5):
        """Close the pipe (everything told ended has been undone by its owner) and wait for the exit."""
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def supervising():
    """While the body runs, a supervisor undoes whatever is left open if this process dies."""
    if _ACTIVE:                                   # already supervised (a tune's trials inside it)
        yield _ACTIVE[0]
        return
    reaper = Reaper()
    _ACTIVE.append(reaper)
    try:
        yield reaper
    finally:
        _ACTIVE.remove(reaper)
        reaper.close()


def tell(**message):
    """Tell the active supervisor (if any) what was started or ended."""
    if _ACTIVE:
        _ACTIVE[0].tell(**message)


def job_token(name):
    return f"{os.getpid()}-{name}"


# ------------------------------------------------------------------ the supervisor
def _living(tokens, groups, proc="/proc"):
    """Pids, not zombies, whose environment holds one of ``tokens`` (as TOKEN=value) or whose process
    group is one of ``groups``."""
    wanted = {f"{TOKEN}={t}".encode() for t in tokens}
    out = []
    for name in os.listdir(proc):
        if not name.isascii() or not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(os.path.join(proc, name, "stat"), "rb") as f:
                stat = f.read()
            state, _, group = stat[stat.rindex(b")") + 2:].split()[:3]
            if state in (b"Z", b"X"):
                continue
            if int(group) in groups:
                out.append(int(name))
                continue
            with open(os.path.join(proc, name, "environ"), "rb") as f:
                entries = set(f.read().split(b"\0"))
        except (OSError, ValueError):
            continue
        if entries & wanted:
            out.append(int(name))
    return out


def end_jobs(jobs, deadline):
    """Continue and kill every process of ``jobs`` ({token: process group or None}) until none is left."""
    groups = {g for g in jobs.values() if g}
    while time.monotonic() < deadline:
        pids = _living(jobs, groups)
        if not pids:
            return
        for sig in (signal.SIGCONT, signal.SIGKILL):      # continued first: nothing is left stopped
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        time.sleep(0.05)


def remove_group(path, root, deadline):
    """Empty a CPU group into ``root`` and remove it (a process just killed leaves it a moment later)."""
    while time.monotonic() < deadline:
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                members = f.read().split()
        except OSError:
            return
        for pid in members:
            with contextlib.suppress(OSError):
                with open(os.path.join(root, "cgroup.procs"), "w") as f:
                    f.write(pid)
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)


def undo(state):
    """Everything still open in ``state`` (what the pipe said), undone."""
    deadline = time.monotonic() + KILL_S
    if state["jobs"]:
        end_jobs(state["jobs"], deadline)
    for path, root in state["groups"].items():
        remove_group(path, root, deadline)
    if state["links"]:
        for args in state["links"].values():
            with contextlib.suppress(Exception):        # what can be set back is; the rest was torn down
                cluster.shape_link(*args)


def serve(lines):
    """Read what the comparison says until its end of the pipe closes; then undo what is open."""
    state = {"jobs": {}, "groups": {}, "links": {}}
    for line in lines:
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if "job" in m:
            state["jobs"][m["job"]] = m.get("group")
        elif "job_ended" in m:
            state["jobs"].pop(m["job_ended"], None)
        elif "group" in m and "root" in m:
            state["groups"][m["group"]] = m["root"]
        elif "group_removed" in m:
            state["groups"].pop(m["group_removed"], None)
        elif "link" in m:
            state["links"][m["link"]] = m["normal"]
        elif "link_restored" in m:
            state["links"].pop(m["link_restored"], None)
    undo(state)


def supervise():
    """The supervisor process: this comparison's signals are not its own; it ends at the pipe's end."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)      # the comparison's signals are its own; this ends at EOF
    serve(sys.stdin)
    return 0


if __name__ == "__main__":
    sys.exit(supervise())
