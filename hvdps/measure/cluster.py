"""The emulated cluster: network namespaces on a bridge, each link shaped with tc tbf, and everything it
brought up torn down again, also after a crash (its state under /run/hvdps-emulate)."""
import ipaddress
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time

from common.base.errors import UsageError
from common.base.procs import REPO, exists
from hvdps.measure.slurm_lab import SHM, remove_netns_etc, shm_dir


STATE_DIR = "/run/hvdps-emulate"


AGENT = os.path.join(REPO, "hvdps", "measure", "netns_agent.sh")


OMPI_TMP = "/tmp/hvdps-ompi"      # one Open MPI session folder per emulated host (netns_agent.sh)


PREFIX = "hvdps-"


_RATE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(bit|kbit|mbit|gbit)$", re.I)


_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def parse_links(texts, hosts):
    """--link hN=RATE (repeatable, or comma-separated) -> {host index from 0: rate}: one host's own
    link, both directions, as a slow node's would be."""
    out = {}
    for part in (p.strip() for text in texts for p in text.split(",")):
        host, sep, rate = part.partition("=")
        m = re.fullmatch(r"h([0-9]+)", host.strip())
        if not sep or not m or not rate.strip():
            raise UsageError(f"--link expects hN=RATE like h2=10mbit (host 2's own link), got {part!r}")
        i = int(m.group(1))
        if not 1 <= i <= hosts:
            raise UsageError(f"--link {part}: no host h{i} (the cluster has h1..h{hosts})")
        if i - 1 in out:
            raise UsageError(f"--link names h{i} twice")
        parse_rate(rate.strip(), "--link")
        out[i - 1] = rate.strip()
    return out


def parse_rate(text, flag="--rate"):
    """tc's rate syntax (100mbit, 1gbit, 500kbit) -> bits per second."""
    m = _RATE.match(text.strip())
    if not m:
        raise UsageError(f"{flag} {text!r}: expected a rate like 100mbit, 1gbit or 500kbit")
    bps = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not 1e3 <= bps <= 1e15:
        raise UsageError(f"{flag} {text!r}: a link's rate must be from 1kbit to 1000000gbit")
    return bps


def shape_link(host_ns, switch_ns, port, rate, queue_ms, verb="add"):
    """A token bucket on both ends of one host's link: the host's eth0 shapes what it sends, its
    switch port (``port``: h1, h2, ...) what it receives. Burst: 5 ms at the rate (at least 16 kB, a
    few frames); a queue of ``queue_ms``, so TCP sees delay rather than drops and no retransmission
    is counted. ``verb`` "change" sets a link already shaped to another rate (hvdps compare
    --slow_link, run by run); RuntimeError with tc's own line if tc refuses."""
    burst = max(16 * 1024, int(parse_rate(rate) / 8 * 0.005))
    for ns, device in ((host_ns, "eth0"), (switch_ns, port)):
        sh("tc", "-n", ns, "qdisc", verb, "dev", device, "root", "tbf", "rate", rate,
           "burst", str(burst), "latency", f"{queue_ms}ms")


def sh(*argv, timeout=30):
    """Run one ip/tc command; its own error line if it fails."""
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError((r.stderr.strip() or r.stdout.strip() or f"exit {r.returncode}").splitlines()[0])
    return r.stdout


def _namespaces():
    try:
        return [line.split()[0] for line in sh("ip", "netns", "list").splitlines() if line.strip()]
    except (RuntimeError, OSError):
        return []


def remove_namespaces(names, grace=3.0):
    """Kill every process in these namespaces (TERM, then KILL), then delete them, and the Open MPI
    session folders the agent gave each (hvdps/measure/netns_agent.sh)."""
    asked, names = list(names), [n for n in names if n in set(_namespaces())]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = []
        for ns in names:
            try:
                pids += [int(p) for p in sh("ip", "netns", "pids", ns).split()]
            except (RuntimeError, ValueError, OSError):
                pass
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 1.0)
        while pids and time.monotonic() < deadline and any(exists(p) for p in pids):
            time.sleep(0.1)
    for ns in reversed(names):
        try:
            sh("ip", "netns", "del", ns)
        except (RuntimeError, OSError):
            pass
    for ns in asked:
        shutil.rmtree(os.path.join(OMPI_TMP, ns), ignore_errors=True)
    try:
        os.rmdir(OMPI_TMP)            # only once no other cluster's hosts have theirs in it
    except OSError:
        pass


def cleanup_stale(out=sys.stdout):
    """Remove what runs that are no longer alive left: namespaces named hvdps-<pid>-*, their state."""
    removed = []
    owners = {}
    for ns in _namespaces():
        m = re.match(rf"^{PREFIX}(\d+)-", ns)
        if m:
            owners.setdefault(int(m.group(1)), []).append(ns)
    if os.path.isdir(STATE_DIR):
        for name in os.listdir(STATE_DIR):
            m = re.match(r"^(\d+)\.json$", name)
            if m:
                owners.setdefault(int(m.group(1)), [])
    if os.path.isdir(OMPI_TMP):          # session folders whose namespace went another way
        for name in os.listdir(OMPI_TMP):
            m = re.match(rf"^{PREFIX}(\d+)-", name)
            if m:
                owners.setdefault(int(m.group(1)), [])
                if name not in owners[int(m.group(1))]:
                    owners[int(m.group(1))].append(name)
    for name in os.listdir(SHM) if os.path.isdir(SHM) else []:   # a SLURM lab's segments
        m = re.match(r"^hvdps-emulate-(\d+)-slurm$", name)
        if m:
            owners.setdefault(int(m.group(1)), [])
    for pid, names in owners.items():
        if pid != os.getpid() and exists(pid):
            continue
        remove_namespaces(names)
        remove_netns_etc(names)
        shutil.rmtree(os.path.join(STATE_DIR, f"{pid}-slurm"), ignore_errors=True)
        shutil.rmtree(shm_dir(pid), ignore_errors=True)
        removed += names
        try:
            os.unlink(os.path.join(STATE_DIR, f"{pid}.json"))
        except OSError:
            pass
    if removed:
        print(f"removed {len(removed)} namespace(s) a stopped run left behind: {', '.join(removed)}", file=out)
    return removed


def _free_subnet():
    """A 10.231.X.0/24 that no interface or route of this machine and no live emulation uses."""
    used = sh("ip", "-o", "addr") + sh("ip", "route")
    taken = set()
    for ns in _namespaces():
        if ns.startswith(PREFIX):
            try:
                taken |= set(re.findall(r"10\.231\.(\d+)\.", sh("ip", "-n", ns, "-o", "addr")))
            except (RuntimeError, OSError):
                pass
    for x in range(1, 255):
        net = ipaddress.ip_network(f"10.231.{x}.0/24")
        if str(x) not in taken and not any(ipaddress.ip_address(a) in net for a in
                                           re.findall(r"\b(\d+\.\d+\.\d+\.\d+)", used)):
            return f"10.231.{x}"
    raise UsageError("no free 10.231.X.0/24 subnet for the emulated cluster")


# The latency probe's two ends (run inside two host namespaces): an echo server on the host's
# own address, and a client that prints the median round trip of ROUNDS 1-byte exchanges.
PONG = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    b = c.recv(1)
    if not b:
        break
    c.sendall(b)
"""


PING = """
import socket, statistics, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
times = []
for _ in range(int(sys.argv[3])):
    t = time.perf_counter(); c.sendall(b"x"); c.recv(1); times.append(time.perf_counter() - t)
print(statistics.median(times[10:] or times))
"""


def read_line(proc, timeout, what="the latency probe's server"):
    """The first line ``proc`` prints, or RuntimeError after ``timeout`` seconds."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline().strip() if ready else ""
    if not line:
        raise RuntimeError(f"{what} did not start within {timeout} s")
    return line


class EmulatedCluster:
    """N shaped hosts and a login namespace on one bridge; ``down`` removes all of it."""

    def __init__(self, count, rate, queue_ms=200, links=None):
        self.count, self.rate, self.rate_bps = count, rate, parse_rate(rate)
        self.links = dict(links or {})          # {host index from 0: its own rate}: a slow link (--link)
        self.queue_ms = queue_ms
        self.tag = f"{PREFIX}{os.getpid()}"
        self.sw, self.login = f"{self.tag}-sw", f"{self.tag}-login"
        self.hosts = [f"{self.tag}-h{i + 1}" for i in range(count)]
        self.subnet = None
        self.addrs = []
        self.sleeper = None
        self.latency = {}
        self.state = os.path.join(STATE_DIR, f"{os.getpid()}.json")

    def up(self):
        os.makedirs(STATE_DIR, exist_ok=True)
        self.subnet = _free_subnet()
        self.addrs = [f"{self.subnet}.{i + 1}" for i in range(self.count)]
        with open(self.state, "w") as f:      # first, so a crash while building is cleaned up next time
            json.dump({"pid": os.getpid(), "namespaces": [self.sw, self.login, *self.hosts]}, f)
        sh("ip", "netns", "add", self.sw)
        sh("ip", "-n", self.sw, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.sw, "link", "set", "br0", "up")
        for ns, port, addr in [*zip(self.hosts, [f"h{i + 1}" for i in range(self.count)], self.addrs),
                               (self.login, "login", f"{self.subnet}.254")]:
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", self.sw)
            sh("ip", "-n", self.sw, "link", "set", port, "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        self.shape()
        # A process in the switch's namespace: its /proc/PID/net/dev is every link's counters.
        self.sleeper = subprocess.Popen(["ip", "netns", "exec", self.sw, "sleep", "infinity"],
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def shape(self):
        """Each host's link at its rate (``shape_link``)."""
        for i, ns in enumerate(self.hosts):
            rate = self.rate_of(i)
            try:
                shape_link(ns, self.sw, f"h{i + 1}", rate, self.queue_ms)
            except RuntimeError as exc:
                flag = f"--link h{i + 1}={rate}" if i in self.links else f"--rate {rate}"
                raise UsageError(f"{flag}: tc refused it: {exc}")

    def rate_of(self, i):
        """Host ``i``'s (from 0) link rate in tc's syntax: its own (--link), else the cluster's."""
        return self.links.get(i, self.rate)

    def measure_latency(self, rounds=200, timeout=30):
        """One-way latency between two hosts: half the median round trip of a 1-byte TCP
        ping-pong (TCP_NODELAY) from h1 to h2 across the bridge, the alpha hvdps project uses.
        Both ends are processes this call starts and kills; every wait is bounded."""
        server = subprocess.Popen(["ip", "netns", "exec", self.hosts[1], sys.executable, "-c", PONG,
                                   self.addrs[1]], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                  text=True, start_new_session=True)
        try:
            port = read_line(server, timeout)
            out = subprocess.run(["ip", "netns", "exec", self.hosts[0], sys.executable, "-c", PING,
                                  self.addrs[1], port, str(rounds)], capture_output=True, text=True,
                                 timeout=timeout, stdin=subprocess.DEVNULL)
            if out.returncode:
                raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "ping failed")
            rtt = float(out.stdout.split()[0])
            return {"rtt_s": rtt, "latency_s": rtt / 2, "latency_rounds": rounds}
        finally:
            try:
                os.killpg(server.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            server.wait(timeout=5)

    def describe(self, names=None):
        """``names``: the hosts' names when the comparison knows them by name (SLURM's node names)."""
        return {"counters": f"/proc/{self.sleeper.pid}/net/dev",
                "ports": {(names[i] if names else a): f"h{i + 1}" for i, a in enumerate(self.addrs)},
                "rate": self.rate, "rate_bps": self.rate_bps, "subnet": f"{self.subnet}.0/24",
                "rates": {(names[i] if names else a): parse_rate(self.rate_of(i)) for i, a in enumerate(self.addrs)},
                "namespaces": dict(zip(self.addrs, self.hosts)), "switch": self.sw, "queue_ms": self.queue_ms,
                **self.latency}

    def netns_map(self):
        return ",".join(f"{a}={n}" for a, n in zip(self.addrs, self.hosts))

    def down(self):
        remove_namespaces([self.sw, self.login, *self.hosts])
        if self.sleeper:
            try:
                self.sleeper.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        left = [n for n in _namespaces() if n.startswith(self.tag + "-")]
        if not left:
            try:
                os.unlink(self.state)
            except OSError:
                pass
        return left
