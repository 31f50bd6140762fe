"""Run a command on a remote host so that it dies with the connection that started it.

    ssh HOST 'cd /repo && exec python -m common.launch.tether python -m ps_train.main ...'

A process started through ``ssh HOST cmd`` keeps running when the ssh client
is killed: sshd closes the session's pipes but sends no signal unless a
terminal was allocated. Open MPI's orted solves this for MPI ranks by watching
its connection to mpirun; the PS tasks hvdps starts on other hosts need the
same, so a launcher that stops (Ctrl-C, a failed role, a killed compare)
leaves nothing running on any host.

The tether keeps the command's pid (it ``exec``s it, so signals sent to the
pid, ``ip netns pids`` and /proc CPU figures all reach the trainer itself) and
leaves a small watcher behind: when the launcher's end of standard input
closes, the watcher sends SIGTERM, then SIGKILL after a grace period. The
watcher dies with the command (PR_SET_PDEATHSIG).
"""
import ctypes
import os
import signal
import sys
import time

GRACE_S = 5.0


def _watch(target):
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.getppid() != target:        # the command already ended before the watcher was armed
        os._exit(0)
    devnull = os.open(os.devnull, os.O_WRONLY)   # hold no output pipe: its reader waits for every writer
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(target, sig)
        except ProcessLookupError:
            os._exit(0)
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline:
            if os.getppid() != target:
                os._exit(0)
            time.sleep(0.1)
    os._exit(0)


def main(argv):
    if not argv:
        print("error: usage: python -m common.launch.tether COMMAND [ARGS...]", file=sys.stderr)
        return 2
    me = os.getpid()
    if os.fork() == 0:
        _watch(me)
    # The command itself must not hold the launcher's pipe, or the pipe never reports its end.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"error: cannot run {argv[0]}: {exc.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
