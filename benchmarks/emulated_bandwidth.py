"""Large-message exchange on the emulated cluster's shaped links, against the links' rate (root).

    sudo .venv/bin/python benchmarks/emulated_bandwidth.py [--hosts 4] [--rate 100mbit] \\
        [--workers 2,3] [--sizes_mb 4,16] [--repeats 5]

Brings up the same emulated cluster hvdps emulate runs the comparison on (network
namespaces on one bridge, each host's link shaped both ways by ``tc tbf``), measures
with no training in the way, and removes every namespace again, also on failure:

- **TCP**, one stream from h1 to h2 (a Python socket, nothing else): the ceiling one
  connection reaches on a link, TCP/IP headers taken;
- **ring all-reduce** with w ranks on w hosts, started by ``mpirun`` from the login
  namespace through the same remote-shell agent and MCA flags ``hvdps compare --hosts``
  uses (TCP on the cluster's subnet, Open MPI's ring algorithm): bare MPI (mpi4py
  ``Allreduce``) and ``hvd.allreduce`` with the MPI controller. Bus bandwidth =
  2(w-1)/w x bytes / time, the bytes each link carries per direction;
- **TensorFlow's ring**, MultiWorkerMirroredStrategy with ``RING`` collectives, w tasks on w
  hosts, each told the cluster by TF_CONFIG: the strategy's own ``all_reduce`` (gRPC), the
  same bus bandwidth as above;
- **PS push and pull** between a worker on h1 and a TensorFlow PS task on h2 (gRPC):
  goodput = bytes / time on the one link they share.

Every figure is also given as a share of the rate ``tc`` enforces. Times are medians over
--repeats after --warmup untimed rounds. Writes benchmarks/results/emulated_bandwidth.json
and prints a markdown table.
"""
import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
from common.base.errors import cli  # noqa: E402
from common.base.flags import Parser, megabytes  # noqa: E402

from common.base.errors import UsageError                        # noqa: E402
from hvdps.commands import emulate                          # noqa: E402
from hvdps.measure import cluster as emulated               # noqa: E402
from hvdps.launchers import Remote, remote_mpi_flags     # noqa: E402
from common.base.procs import child_env                           # noqa: E402
from comm_bandwidth import MWMS_TASK, PS_TASK                # noqa: E402  (this folder is on sys.path)

COMM = os.path.join(HERE, "comm_bandwidth.py")

# One TCP stream: the sink reads SIZE bytes, answers one byte; the source times each round.
SINK = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); size = int(sys.argv[2]); buf = bytearray(1 << 20)
while True:
    left = size
    while left:
        n = c.recv_into(buf, min(left, len(buf)))
        if not n:
            sys.exit(0)
        left -= n
    c.sendall(b"k")
"""
SOURCE = """
import json, socket, statistics, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=120)
size, repeats, warmup = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
data = b"x" * size; times = []
for i in range(warmup + repeats):
    t = time.perf_counter(); c.sendall(data); c.recv(1)
    if i >= warmup:
        times.append(time.perf_counter() - t)
print(json.dumps(statistics.median(times)))
"""


def _stop(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def in_ns(ns, argv):
    return ["ip", "netns", "exec", ns, *argv]


def tcp_stream(cluster, nbytes, repeats, warmup):
    sink = subprocess.Popen(in_ns(cluster.hosts[1], [sys.executable, "-c", SINK, cluster.addrs[1], str(nbytes)]),
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        port = emulated.read_line(sink, 30, "the TCP sink")
        out = subprocess.run(in_ns(cluster.hosts[0], [sys.executable, "-c", SOURCE, cluster.addrs[1], port,
                                                      str(nbytes), str(repeats), str(warmup)]),
                             capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        if out.returncode:
            raise RuntimeError(f"TCP stream: {out.stderr.strip().splitlines()[-1:]}")
        return float(out.stdout.strip())
    finally:
        _stop(sink)


def results_of(stdout):
    return [json.loads(line.split("RESULT ", 1)[1]) for line in stdout.splitlines() if "RESULT " in line]


def without_preconnect(flags):
    """hvdps' cross-host MPI flags less ``mpi_preconnect_mpi 1``: to show what it answers."""
    i = flags.index("mpi_preconnect_mpi")
    return flags[:i - 1] + flags[i + 2:]


def ring(cluster, workers, sizes, repeats, warmup, impl, detail=False, env=(), preconnect=True):
    """One mpirun job over the first ``workers`` hosts, one rank each, from the login namespace.

    ``detail`` (Horovod): rank 0 also writes Horovod's timeline, and each rank times mpi4py's
    ``Allreduce`` in the same process after Horovod's rounds, so a slow Horovod round can be told
    apart into Horovod's own phases and the MPI call it makes (``timeline_phases``)."""
    timeline = f"/tmp/hvdps-timeline-w{workers}.json"
    extra_env, extra_args = [x for kv in env for x in ("-x", kv)], []
    if detail:
        if os.path.exists(timeline):
            os.unlink(timeline)
        extra_env, extra_args = extra_env + ["-x", f"HOROVOD_TIMELINE={timeline}"], ["--with_mpi4py"]
    remote = Remote(hosts_text=",".join(cluster.addrs[:workers]),
                        hosts=tuple((a, 1) for a in cluster.addrs[:workers]),
                        agent=(emulated.AGENT,), rsh_given=True, network=f"{cluster.subnet}.0/24")
    argv = ["mpirun", "-np", str(workers), "--host", ",".join(cluster.addrs[:workers]), "-bind-to", "none",
            *(remote_mpi_flags(remote) if preconnect else without_preconnect(remote_mpi_flags(remote))),
            "-x", "PATH", "-x", "PYTHONPATH", "-x", "TF_CPP_MIN_LOG_LEVEL",
            "-x", "HOROVOD_CPU_OPERATIONS=mpi", *extra_env, sys.executable, COMM, "--worker", "allreduce",
            "--impl", impl, *extra_args,
            "--sizes_json", json.dumps(sizes), "--repeats", str(repeats), "--warmup", str(warmup)]
    p = subprocess.run(in_ns(cluster.login, argv), capture_output=True, text=True, timeout=1800, cwd=REPO,
                       env=child_env(HVDPS_NETNS_MAP=cluster.netns_map()), stdin=subprocess.DEVNULL)
    got = results_of(p.stdout)
    if not got:
        raise RuntimeError(f"{impl} ring over {workers} hosts failed ({p.returncode}): "
                           f"{(p.stderr.strip().splitlines() or ['no output'])[-1]}")
    if detail:
        got += timeline_phases(timeline, sizes)
    return got


def timeline_phases(path, sizes):
    """Median time per Horovod timeline activity (NEGOTIATE_ALLREDUCE, ALLREDUCE, MPI_ALLREDUCE, ...)
    of each size's rounds, as result rows ``horovod-phase:<ACTIVITY>``.

    The timeline is Chrome tracing JSON with begin/end events per activity. In eager mode every
    round is one "process" (HorovodAllreduce), so a round's size is read from the shape its
    ALLREDUCE end event carries; the negotiation before it and the phases inside it take that
    size. Rank 0 leaves without closing the array (comm_bandwidth skips MPI finalisation), so the
    tail is read leniently."""
    import math
    import statistics
    try:
        with open(path) as f:
            text = f.read().strip().rstrip(",")
    except OSError:
        return []
    try:
        events = json.loads(text if text.endswith("]") else text + "]")
    except ValueError:
        try:                                        # cut inside an event: drop the partial one
            events = json.loads(text.rsplit("},", 1)[0] + "}]")
        except ValueError:
            print(f"note: {path}: not a readable Horovod timeline; its phases are left out", file=sys.stderr)
            return []
    spans, open_, pending = {}, {}, {}
    for e in events:
        pid = e.get("pid")
        if e.get("ph") == "B":
            open_.setdefault(pid, []).append((e.get("name"), e["ts"]))
        elif e.get("ph") == "E" and open_.get(pid):
            activity, ts = open_[pid].pop()
            pending.setdefault(pid, []).append((activity, (e["ts"] - ts) / 1e6))
            shape = (e.get("args") or {}).get("shape")
            if shape:
                nbytes = 4 * math.prod(int(x) for x in shape.strip("[]").split(",") if x.strip())
                for act, secs in pending.pop(pid):
                    spans.setdefault((nbytes, act), []).append(secs)
    rows = []
    for label, nbytes in sizes:
        n = max(1, nbytes // 4) * 4
        for (size, activity), secs in sorted(spans.items()):
            if size == n:
                rows.append({"label": label, "bytes": nbytes, "impl": f"horovod-phase:{activity}",
                             "seconds": statistics.median(secs), "count": len(secs)})
    return rows


def tf_ring(cluster, workers, sizes, repeats, warmup):
    """One MultiWorkerMirroredStrategy task on each of the first ``workers`` hosts, its gRPC server
    bound to its host's own address (the bind shim), not every interface."""
    from common.base.procs import free_ports, shim_library
    port = free_ports(1)[0]     # a port free here; the hosts' namespaces have nothing bound
    spec = {"worker": [f"{a}:{port}" for a in cluster.addrs[:workers]]}
    procs = []
    try:
        for i, (ns, addr) in enumerate(zip(cluster.hosts[:workers], cluster.addrs[:workers])):
            env = child_env(TF_CONFIG=json.dumps({"cluster": spec, "task": {"type": "worker", "index": i}}),
                            LD_PRELOAD=shim_library() or "", HVDPS_BIND_ADDR=addr, HVDPS_BIND_PORT=str(port))
            procs.append(subprocess.Popen(in_ns(ns, [sys.executable, "-c", MWMS_TASK, json.dumps(sizes), str(repeats),
                                                     str(warmup)]), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          stdin=subprocess.DEVNULL, text=True, env=env, cwd=REPO,
                                          start_new_session=True))
        out, err = procs[0].communicate(timeout=1800)
        got = results_of(out)
        if not got:
            raise RuntimeError(f"TensorFlow ring over {workers} hosts failed ({procs[0].returncode}): "
                               f"{(err.strip().splitlines() or ['no output'])[-1]}")
        return got
    finally:
        for p in procs:
            _stop(p)


def ps(cluster, sizes, repeats, warmup):
    """A PS task on h2, the worker on h1: push (worker -> PS) and pull (PS -> worker)."""
    from common.base.procs import free_ports
    port = free_ports(1)[0]     # a port free here; the hosts' namespaces have nothing bound
    spec = {"ps": [f"{cluster.addrs[1]}:{port}"], "worker": [f"{cluster.addrs[0]}:{port}"]}
    env = child_env()
    server = subprocess.Popen(in_ns(cluster.hosts[1], [sys.executable, "-c", PS_TASK, json.dumps(spec)]),
                              stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env,
                              start_new_session=True)
    try:
        emulated.read_line(server, 120, "the PS task")
        p = subprocess.run(in_ns(cluster.hosts[0], [sys.executable, COMM, "--worker", "ps", "--cluster_json",
                                                    json.dumps(spec), "--sizes_json", json.dumps(sizes),
                                                    "--repeats", str(repeats), "--warmup", str(warmup)]),
                           capture_output=True, text=True, timeout=1800, env=env, stdin=subprocess.DEVNULL)
        got = results_of(p.stdout)
        if not got:
            raise RuntimeError(f"PS push/pull failed ({p.returncode}): "
                               f"{(p.stderr.strip().splitlines() or ['no output'])[-1]}")
        return got
    finally:
        _stop(server)


def link_bytes(rec):
    """Bytes each link carries one way for this exchange: the ring's 2(w-1)/w x M, else M."""
    w = rec.get("workers", 1)
    ring = rec["impl"] in ("mpi4py", "horovod-mpi", "mwms", "mpi4py-beside-horovod") or \
        rec["impl"].startswith(("horovod-phase:", "mpi4py:"))
    return rec["bytes"] * (2 * (w - 1) / w if ring else 1)


def table(results, rate_bps):
    names = {"tcp": "TCP, one stream", "mpi4py": "bare MPI ring (mpi4py Allreduce)",
             "horovod-mpi": "Horovod ring (hvd.allreduce, MPI)",
             "mpi4py-beside-horovod": "mpi4py Allreduce in the Horovod process, after its rounds",
             "mwms": "TensorFlow ring (MultiWorkerMirrored, gRPC)", "ps-push": "PS push (worker -> PS)",
             "ps-pull": "PS pull (PS -> worker)"}
    lines = ["| exchange | hosts | size | median time | bytes per link, one way | link goodput | x link rate |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        per_link = link_bytes(r)
        bps = per_link * 8 / r["seconds"]
        lines.append(f"| {names.get(r['impl'], r['impl'])} | {r.get('workers', 2)} | {r['bytes'] / 2**20:.0f} MiB | "
                     f"{r['seconds'] * 1e3:.0f} ms | {per_link / 2**20:.2f} MiB | {bps / 1e6:.1f} Mbit/s | "
                     f"{bps / rate_bps:.2f} |")
    return "\n".join(lines)


@cli
def main():
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--workers", default="2,3", help="ring sizes (ranks, one per host)")
    ap.add_argument("--sizes_mb", type=megabytes, default=megabytes("4,16"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--queue_ms", type=int, default=200, help="tbf queue on each link end, as hvdps emulate")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--exchanges", default="tcp,mpi4py,horovod,mwms,ps",
                    help="which exchanges to measure (tcp, mpi4py, horovod, mwms, ps)")
    ap.add_argument("--horovod_detail", action="store_true",
                    help="Horovod's rounds also with its timeline's phases and mpi4py in the same process")
    ap.add_argument("--horovod_env", default="", help="environment for the Horovod rings, e.g. "
                    "'HOROVOD_CYCLE_TIME=50 HOROVOD_CACHE_CAPACITY=0'")
    ap.add_argument("--no_preconnect", action="store_true",
                    help="the MPI rings without mpi_preconnect_mpi 1 (Open MPI opens each pair's links on first use)")
    ap.add_argument("--mpi4py_variants", default="",
                    help="bare MPI rings with what a Horovod process does differently, comma-separated: "
                         "multiple, multiple+thread, inplace, multiple+cycle, ... (comm_bandwidth.py)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "emulated_bandwidth.json"))
    args = ap.parse_args()
    try:
        emulate.check_tools()
        workers = [int(w) for w in args.workers.split(",")]
        if min(workers) < 2 or max(workers) > args.hosts:
            raise UsageError(f"--workers {args.workers}: each must be 2..--hosts ({args.hosts})")
        exchanges = args.exchanges.split(",")
        wrong = sorted(set(exchanges) - {"tcp", "mpi4py", "horovod", "mwms", "ps"})
        if wrong:
            raise UsageError(f"--exchanges: {', '.join(wrong)}: choose from tcp, mpi4py, horovod, mwms, ps")
        from comm_bandwidth import MPI4PY_OPTIONS
        for variant in filter(None, args.mpi4py_variants.split(",")):
            if set(variant.split("+")) - MPI4PY_OPTIONS:
                raise UsageError(f"--mpi4py_variants: {variant}: options are "
                                         f"{', '.join(sorted(MPI4PY_OPTIONS))}, joined by +")
        if any("=" not in kv for kv in args.horovod_env.split()):
            raise UsageError(f"--horovod_env: {args.horovod_env}: NAME=VALUE pairs, space-separated")
    except (UsageError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sizes = list(args.sizes_mb)
    emulated.cleanup_stale()
    cluster = emulated.EmulatedCluster(args.hosts, args.rate, args.queue_ms)
    results = []
    t0 = time.time()
    try:
        cluster.up()
        for label, nbytes in sizes if "tcp" in exchanges else ():
            results.append({"label": label, "bytes": nbytes, "impl": "tcp", "workers": 2,
                            "seconds": tcp_stream(cluster, nbytes, args.repeats, args.warmup)})
        for w in workers:
            for impl in ("mpi4py", "mpi"):
                if ("mpi4py" if impl == "mpi4py" else "horovod") in exchanges:
                    for r in ring(cluster, w, sizes, args.repeats, args.warmup, impl,
                                  detail=args.horovod_detail and impl == "mpi",
                                  env=args.horovod_env.split() if impl == "mpi" else (),
                                  preconnect=not args.no_preconnect):
                        results.append(dict(r, workers=w))
            for variant in filter(None, args.mpi4py_variants.split(",")):
                results += [dict(r, workers=w) for r in ring(cluster, w, sizes, args.repeats, args.warmup,
                                                             f"mpi4py:{variant}", preconnect=not args.no_preconnect)]
            if "mwms" in exchanges:
                results += [dict(r, workers=w) for r in tf_ring(cluster, w, sizes, args.repeats, args.warmup)]
        if "ps" in exchanges:
            results += [dict(r, workers=2) for r in ps(cluster, sizes, args.repeats, args.warmup)]
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        left = cluster.down()
        if left:
            print(f"error: namespaces left: {', '.join(left)}; run hvdps emulate --cleanup", file=sys.stderr)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"rate": args.rate, "rate_bps": cluster.rate_bps, "hosts": args.hosts, "repeats": args.repeats,
                   "warmup": args.warmup, "minutes": round((time.time() - t0) / 60, 1),
                   "command": shlex.join(["sudo", os.path.relpath(sys.executable, REPO)] + sys.argv),
                   "results": [dict(r, link_bytes=link_bytes(r),
                                    x_rate=link_bytes(r) * 8 / r["seconds"] / cluster.rate_bps) for r in results]},
                  f, indent=2)
    print(table(results, cluster.rate_bps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
