"""Start a whole parameter-server cluster on this machine, for development and tests.

    python -m ps_train.launch --num_ps 2 --num_workers 2 [--sync] [trainer flags...]

Every role gets a free localhost port; each role's output lines are prefixed
with its name (``[ps:0]``, ``[worker:1]``); the exit code is the chief's. On
exit, Ctrl-C, SIGTERM, or a role failing, every process is torn down: the
children also die with the launcher (PDEATHSIG), so nothing is orphaned.
"""
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.config import Parser
from common.errors import UsageError, cli

_PR_SET_PDEATHSIG = 1


def free_ports(n, host="127.0.0.1"):
    """Ports the kernel says are free now; all held open together so they are distinct."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _die_with_parent():
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def _pump(name, stream, out, lock):
    for line in iter(stream.readline, b""):
        with lock:
            out.write(f"[{name}] {line.decode(errors='replace')}")
            out.flush()
    stream.close()


class Cluster:
    """The processes of one local cluster, and their orderly or forced end."""

    def __init__(self, tasks, trainer_args, env=None, out=sys.stdout):
        self.tasks = tasks            # [(name, argv)]
        self.trainer_args = trainer_args
        self.env = env or {}
        self.out = out
        self.lock = threading.Lock()
        self.procs = {}
        self.threads = []
        self.cpu = {}

    def start(self):
        for name, argv, extra_env in self.tasks:
            env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env, **extra_env)
            cpus = env.pop("HVDPS_PIN_CPU", None)

            def prepare(cpus=cpus):
                _die_with_parent()
                if cpus is not None:
                    os.sched_setaffinity(0, {int(cpus)})
            p = subprocess.Popen(argv + self.trainer_args, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, env=env, preexec_fn=prepare)
            self.procs[name] = p
            t = threading.Thread(target=_pump, args=(name, p.stdout, self.out, self.lock), daemon=True)
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

    def sample_cpu(self):
        """CPU seconds (user+system) each role has used so far; kept after the role exits."""
        tick = os.sysconf("SC_CLK_TCK")
        for name, p in self.procs.items():
            try:
                fields = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()
                self.cpu[name] = (int(fields[11]) + int(fields[12])) / tick
            except (OSError, IndexError, ValueError):
                pass


def build_tasks(num_ps, num_workers, host, python=sys.executable, threads=None, pin=False):
    ports = free_ports(num_ps + num_workers, host)
    ps_hosts = ",".join(f"{host}:{p}" for p in ports[:num_ps])
    worker_hosts = ",".join(f"{host}:{p}" for p in ports[num_ps:])
    tasks = []
    for job, count in (("ps", num_ps), ("worker", num_workers)):
        for i in range(count):
            argv = [python, "-u", "-m", "ps_train.main", f"--job_name={job}", f"--task_index={i}",
                    f"--ps_hosts={ps_hosts}", f"--worker_hosts={worker_hosts}"]
            env = {"HVDPS_THREADS": str(threads)} if threads and job == "worker" else {}
            if pin and job == "worker":   # one core per worker; PS tasks float (their CPU is reported)
                env["HVDPS_PIN_CPU"] = str(i % (os.cpu_count() or 1))
            tasks.append((f"{job}:{i}", argv, env))
    return tasks


def supervise(cluster, sync, timeout=None):
    """Wait for the chief (worker:0); decide what other roles' deaths mean. Returns the exit code."""
    chief = cluster.procs["worker:0"]
    started = time.monotonic()
    reported = set()
    while True:
        cluster.sample_cpu()
        code = chief.poll()
        if code is not None:
            break
        for name, p in cluster.procs.items():
            rc = p.poll()
            if rc is None or name in reported:
                continue
            reported.add(name)
            if name.startswith("ps:") and rc == 0:
                cluster.say(f"{name} finished")   # released by the chief; the chief exits next
                continue
            if name.startswith("ps:") or (rc != 0 and sync):
                cluster.say(f"{name} exited with code {rc}; "
                            f"{'a PS is gone' if name.startswith('ps:') else 'sync training needs every worker'}"
                            f": stopping the cluster")
                return rc or 1
            cluster.say(f"{name} exited with code {rc}"
                        f"{'; async training continues without it' if rc else ''}")
        if timeout and time.monotonic() - started > timeout:
            cluster.say(f"timed out after {timeout:.0f}s: stopping the cluster")
            return 124
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
    return code


def parse_args(argv):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--num_ps", type=int, default=1)
    p.add_argument("--num_workers", type=int, default=2)
    p.add_argument("--host", default="127.0.0.1", help="address every task listens on")
    p.add_argument("--threads_per_worker", type=int, default=0, help="TF threads per worker (0: TF default)")
    p.add_argument("--pin_workers", action="store_true",
                   help="pin worker i to core i (equal core budget per worker, for scaling benchmarks)")
    p.add_argument("--timeout", type=float, default=0, help="stop everything after this many seconds (0: none)")
    args, rest = p.parse_known_args(argv)
    for bad in ("--job_name", "--task_index", "--ps_hosts", "--worker_hosts", "--chief_host", "--cluster_spec"):
        if any(a == bad or a.startswith(bad + "=") for a in rest):
            raise UsageError(f"{bad} is chosen by the launcher; do not pass it")
    if args.num_ps < 1 or args.num_workers < 1:
        raise UsageError("--num_ps and --num_workers must be at least 1")
    return args, rest


@cli
def main(argv=None):
    args, rest = parse_args(sys.argv[1:] if argv is None else argv)
    # Validate the trainer flags once, here, rather than as N identical failures.
    from ps_train.main import validate_trainer_args
    validate_trainer_args(rest)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {"PYTHONPATH": repo + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cluster = Cluster(build_tasks(args.num_ps, args.num_workers, args.host,
                                  threads=args.threads_per_worker, pin=args.pin_workers), rest, env=env)
    sync = "--sync" in rest
    code = 1
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        cluster.start()
        cluster.say("started " + ", ".join(f"{n} (pid {pid})" for n, pid in cluster.pids().items()))
        code = supervise(cluster, sync, args.timeout or None)
    except KeyboardInterrupt:
        cluster.say("interrupted: stopping the cluster")
        code = 130
    finally:
        cluster.stop()
        for s, h in previous.items():
            signal.signal(s, h)
    cluster.say("cpu seconds: " + ", ".join(f"{n} {c:.1f}" for n, c in sorted(cluster.cpu.items())))
    train_dir = _flag_value(rest, "--train_dir") or _flag_value(rest, "--out")
    if train_dir and os.path.isdir(train_dir):   # the PS tasks' cost belongs in the results too
        with open(os.path.join(train_dir, "launch.json"), "w") as f:
            json.dump({"cpu_seconds": cluster.cpu, "exit_code": code, "pids": cluster.pids()}, f, indent=2)
    cluster.say(f"chief exit code {code}")
    return code


def _flag_value(argv, flag):
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


if __name__ == "__main__":
    sys.exit(main())
