"""hvdps emulate: an emulated cluster on this machine, and the comparison run across it.

    sudo hvdps emulate --hosts 4 --rate 100mbit -- --workers 2,3 --backends horovod,ps
    sudo hvdps emulate --hosts 3 -- --workers 2 --backends mpi,ps --slow_link h2=10mbit   # healthy, then h2 slow
    sudo hvdps emulate --hosts 4 --rate 100mbit -- tune --workers 4 --backends horovod,ps   # a tune on it
    sudo hvdps emulate --cleanup          # remove what a killed run left behind
    sudo hvdps emulate --slurm --hosts 3 --sbatch hostfiles/slurm/ps.sbatch -- --workers 2 --backends horovod,ps

With ``--slurm`` the hosts also run a real SLURM cluster (hvdps/measure/slurm_lab.py: munged and slurmctld
on the login node, ``slurmd -N hK`` on each host): each ``--sbatch`` script is submitted with
``sbatch --wait`` and its runs land in OUT/sbatch, then the comparison runs inside an allocation
of every host (``salloc``, ``hvdps compare --hosts slurm``: MPI through SLURM's own launch, PS
roles through srun).

N hosts are network namespaces on one bridge (itself in a namespace of its own),
each with its own address and its link shaped in both directions to --rate by a
token bucket (``tc qdisc ... tbf``: the host's side shapes what it sends, the
switch's side what it receives). hvdps compare then runs in a further namespace
on the same bridge, the login node, with exactly the flags a real cluster takes:
``--hosts`` the hosts' addresses, ``--rsh`` an agent that enters a host's
namespace the way ssh enters a host (hvdps/measure/netns_agent.sh), and ``--links`` so
the report shows the bytes each link really carried. Every packet stays inside
these namespaces: nothing is added to this machine's own network. The links'
latency (half the median round trip of a TCP ping-pong between two hosts) is
measured once the cluster is up and written to cluster.json beside the rate, so
``hvdps project --from OUT`` projects each run on the links it ran on.

Everything is removed on exit, on Ctrl-C or SIGTERM, when the comparison fails,
and at the next start if a killed run left anything behind (a state file under
/run/hvdps-emulate names what each run created). Deleting a namespace deletes
its veth and the qdiscs on it; processes in it are killed first.
"""
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

from common.spec.config import from_args
from common.base.errors import UsageError, cli
from common.base.flags import Parser
from common.base.files import make_dirs, write_atomic
from common.base.procs import REPO, available_memory, child_env
from hvdps.measure.cluster import AGENT, EmulatedCluster, cleanup_stale, parse_links, parse_rate
from hvdps.measure.slurm_lab import CPUS_PER_NODE, SlurmLab, check_slurm_tools, host_names
from common.spec.plugins import plugins_bounded
from hvdps.commands import compare


def make_parser():
    p = Parser(prog="hvdps emulate", description=__doc__.splitlines()[0],
                                usage="hvdps emulate --hosts N --rate RATE [--out DIR] -- [hvdps compare flags | tune [hvdps tune flags]]")
    p.add_argument("--hosts", type=int, default=4, help="emulated hosts (2-32)")
    p.add_argument("--rate", default="100mbit", help="each host's link, both directions, in tc's syntax")
    p.add_argument("--link", action="append", default=[], metavar="hN=RATE",
                   help="host N's own link (both directions), a slow node's: h2=10mbit; repeatable")
    p.add_argument("--out", default=None, help="report folder (default runs/emulate-<date>)")
    p.add_argument("--cleanup", action="store_true", help="only remove what stopped runs left, then exit")
    p.add_argument("--slurm", action="store_true",
                   help="run SLURM (slurmctld, one slurmd per host) and the comparison inside an allocation")
    p.add_argument("--sbatch", action="append", default=[], metavar="'[VAR=VALUE ...] SCRIPT'",
                   help="with --slurm: submit this batch script (sbatch --wait, with these variables) before the "
                        "comparison; repeatable. Only these run when no comparison flags follow --")
    p.add_argument("--cpus_per_node", type=int, default=CPUS_PER_NODE,
                   help="CPUs each SLURM node declares (the shapes the scripts ask for)")
    return p


def check_cluster_memory(rest, available):
    """Refuse, before any namespace exists, a comparison whose largest run would not fit: every
    emulated host is this machine, so all of a run's tasks share its memory (hvdps.commands.compare's
    check, which a comparison across real hosts skips). ``rest``: the comparison's flags. A flag
    the comparison itself refuses is left to it, to be named in its own words."""
    args = compare.make_parser().parse_args(rest)
    if args.from_dirs:
        return
    compare.absolute_paths(args)
    with plugins_bounded(args.run_timeout, "--run_timeout"):
        try:
            cfg = from_args(args)
        except UsageError:
            return
        compare.check_memory_fits(args, cfg, available)


def check_tools():
    if os.geteuid() != 0:
        raise UsageError("hvdps emulate needs root (it creates network namespaces and qdiscs); run it with sudo")
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            raise UsageError(f"hvdps emulate needs '{tool}' (Debian: apt-get install iproute2)")


def parse_sbatch(text):
    """``'[VAR=VALUE ...] SCRIPT'`` -> (script, {VAR: VALUE}), as a shell reads such a line."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"--sbatch {text!r}: {exc}")
    env = {}
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    if len(words) != 1:
        raise UsageError(f"--sbatch {text!r}: expected '[VAR=VALUE ...] SCRIPT'")
    if not os.path.isfile(words[0]):
        raise UsageError(f"--sbatch {words[0]}: no such file")
    return words[0], env


def submit_all(lab, scripts, out, timeout=3600):
    """Submit each script from the repository (the scripts find .venv there) and wait for it to end
    before the next, so every job has the cluster to itself; its runs go under OUT/sbatch
    (``RUNS_DIR``), its output beside them; a line per job and OUT/sbatch/jobs.json. Returns 1 if any
    job failed. The end is polled with ``scontrol show job`` every half second (``sbatch --wait``
    backs off to half a minute between polls)."""
    folder = make_dirs(os.path.join(out, "sbatch"))
    jobs, code = [], 0
    for script, variables in scripts:
        name = os.path.splitext(os.path.basename(script))[0]
        argv = ["sbatch", "--parsable", f"--output={folder}/{name}-%j.out", os.path.abspath(script)]
        started = time.monotonic()
        r = lab.run(argv, timeout=60, check=False, cwd=REPO, env=lab.env(child_env(RUNS_DIR=folder, **variables)))
        job = r.stdout.strip().split(";")[0] if r.returncode == 0 and r.stdout.strip() else None
        state, exit_code, error = ("NOT_SUBMITTED", 1, (r.stderr or r.stdout).strip()[-500:]) if job is None else \
            wait_job(lab, job, timeout) + (None,)
        shown = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in variables.items()), script])
        output = f"{folder}/{name}-{job}.out" if job else None
        jobs.append({"script": script, "variables": variables, "job": job, "state": state, "exit": exit_code,
                     "seconds": round(time.monotonic() - started, 1), "output": output,
                     "run_dir": run_dir_of(output) if output else None, "error": error})
        state = "completed" if exit_code == 0 else f"{state.lower()} (exit {exit_code}{': ' + error if error else ''})"
        print(f"sbatch {shown}: job {job} {state} in {jobs[-1]['seconds']:.0f}s; output {jobs[-1]['output']}",
              flush=True)
        code = code or (1 if exit_code else 0)
    write_atomic(os.path.join(folder, "jobs.json"), json.dumps(jobs, indent=2))
    return code


def wait_job(lab, job, timeout):
    """(final JobState, exit code) of a job, from ``scontrol show job``; cancelled at ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        r = lab.run(["scontrol", "-o", "show", "job", job], timeout=30, check=False)
        fields = dict(f.split("=", 1) for f in r.stdout.split() if "=" in f)
        state = fields.get("JobState", "UNKNOWN")
        if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "UNKNOWN"):
            code, _, signal_no = fields.get("ExitCode", "1:0").partition(":")
            return state, int(code) or (128 + int(signal_no) if signal_no not in ("", "0") else
                                        (0 if state == "COMPLETED" else 1))
        if time.monotonic() > deadline:
            lab.run(["scancel", job], timeout=30, check=False)
            return "TIMEOUT", 124
        time.sleep(0.5)


def run_dir_of(output):
    """The folder a job trained into: the --train_dir its trainer printed in the job's output, if any."""
    try:
        text = open(output, errors="replace").read()
    except OSError:
        return None
    found = re.findall(r"--train_dir[ =](\S+)", text) or re.findall(r"^train_dir: (\S+)$", text, re.M)
    return found[-1] if found else None


@cli
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    ours, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    command, rest = ("tune", rest[1:]) if rest[:1] == ["tune"] else ("compare", rest)   # -- tune ...: a tune
    args = make_parser().parse_args(ours)
    check_tools()
    cleanup_stale()
    if args.cleanup:
        return 0
    links, out = validate(args, rest, command)
    cluster = EmulatedCluster(args.hosts, args.rate, links=links)
    lab = SlurmLab(cluster, args.cpus_per_node) if args.slurm else None
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    for s in previous:
        signal.signal(s, on_signal)
    code = 1
    try:
        desc = bring_up(cluster, args, links, out, host_names(args.hosts) if lab else None)
        code = 0
        if lab:
            lab.up()
            print(f"SLURM: slurmctld on the login node, slurmd on {', '.join(host_names(args.hosts))} "
                  f"({args.cpus_per_node} CPUs each), partition lab", flush=True)
            code = submit_all(lab, args.sbatch, out)
        if rest or not args.sbatch:
            code = run_comparison(cluster, lab, rest, desc, out, args.hosts, command) or code
    except KeyboardInterrupt:
        code = 130
    finally:
        code = tear_down(cluster, lab, previous, code)
    return code


def validate(args, rest, command="compare"):
    """(the hosts' own link rates, the output folder): every flag checked, and the comparison's flags
    after ``--`` held to what the cluster decides for it, before anything is built."""
    if not 2 <= args.hosts <= 32:
        raise UsageError(f"--hosts must be 2-32, got {args.hosts}")
    parse_rate(args.rate)
    links = parse_links(args.link, args.hosts)
    if args.sbatch:
        args.slurm = True
    if args.slurm:
        check_slurm_tools()
        if not 1 <= args.cpus_per_node <= 256:
            raise UsageError(f"--cpus_per_node must be 1-256, got {args.cpus_per_node}")
    args.sbatch = [parse_sbatch(s) for s in args.sbatch]
    for flag in ("--hosts", "--rsh", "--links", "--network_interface", "--out", "--train_dir"):
        if any(a.split("=", 1)[0].replace("-", "_") == flag.replace("-", "_") for a in rest if a.startswith("--")):
            raise UsageError(f"{flag} is chosen by hvdps emulate; give hvdps emulate's own --out instead"
                             if flag in ("--out", "--train_dir") else f"{flag} is chosen by hvdps emulate")
    out = os.path.abspath(args.out or os.path.join("runs", time.strftime("emulate-%Y%m%d-%H%M%S")))
    if os.path.exists(os.path.join(out, "report.md")):
        raise UsageError(f"--out {out} already holds a report; choose another directory")
    if (rest or not args.sbatch) and command == "compare":     # a tune checks its candidates itself
        check_cluster_memory(rest, available_memory())
    return links, out


def bring_up(cluster, args, links, out, names):
    """The cluster up, its links' latency measured, and its description (cluster.json) written: the path."""
    try:
        cluster.up()
    except RuntimeError as exc:
        raise UsageError(f"cannot build the emulated cluster: {exc}")
    try:
        cluster.latency = cluster.measure_latency()
    except (RuntimeError, OSError, ValueError, IndexError, subprocess.TimeoutExpired) as exc:
        print(f"note: could not measure the links' latency ({exc}); hvdps project will need --latency_us",
              file=sys.stderr)
    make_dirs(out)
    desc = write_atomic(os.path.join(out, "cluster.json"), json.dumps(cluster.describe(names), indent=2))
    rtt = f"; round trip {cluster.latency['rtt_s'] * 1e6:.0f} us" if cluster.latency else ""
    own = "".join(f", {cluster.addrs[i]}'s {rate}" for i, rate in sorted(links.items()))
    print(f"emulated cluster: {args.hosts} hosts {', '.join(cluster.addrs)}, each link {args.rate} both ways"
          f"{own}; login node {cluster.subnet}.254{rtt}", flush=True)
    return desc


def run_comparison(cluster, lab, rest, desc, out, hosts, command="compare"):
    """The comparison (or with ``-- tune``, the tune) from the login node, through exactly the --hosts
    path (inside one SLURM allocation of every host with a lab): its exit code, 130 when interrupted."""
    compare = [sys.executable, "-m", f"hvdps.commands.{command}", "--network_interface", f"{cluster.subnet}.0/24",
               "--links", desc, "--out", out, *rest]
    if lab:      # the whole comparison inside one allocation of every host, as on a real cluster
        cmd = ["salloc", "--quiet", f"--nodes={hosts}", "--ntasks-per-node=1",
               "--job-name=hvdps-compare", *compare[:3], "--hosts", "slurm", *compare[3:]]
        p = lab.popen(cmd, cwd=REPO, env=lab.env(child_env()))
    else:
        cmd = ["ip", "netns", "exec", cluster.login, *compare[:3], "--hosts", ",".join(cluster.addrs),
               "--rsh", AGENT, *compare[3:]]
        p = subprocess.Popen(cmd, env=child_env(HVDPS_NETNS_MAP=cluster.netns_map()), cwd=REPO,
                             start_new_session=True)
    try:
        return p.wait()
    except KeyboardInterrupt:
        print("interrupted: stopping the comparison and removing the emulated cluster", file=sys.stderr)
        return 130


def tear_down(cluster, lab, previous, code):
    """Every namespace and daemon removed, a second Ctrl-C ignored meanwhile: the exit code."""
    for s, h in previous.items():
        signal.signal(s, h)
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # a second Ctrl-C must not interrupt the teardown
    left = cluster.down()
    if lab:
        lab.down()
    signal.signal(signal.SIGINT, previous[signal.SIGINT])
    if left:
        print(f"error: could not remove namespace(s) {', '.join(left)}; run hvdps emulate --cleanup",
              file=sys.stderr)
        return code or 1
    print("emulated cluster removed", flush=True)
    return code

if __name__ == "__main__":
    sys.exit(main())
