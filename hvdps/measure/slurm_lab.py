"""A real SLURM cluster on the emulated hosts: munged, slurmctld on the login node, one slurmd per host.

    sudo hvdps emulate --slurm --hosts 3 --sbatch hostfiles/slurm/horovod.sbatch -- --workers 2 ...

Debian's slurm-wlm 22.05 and munge, unmodified. Each emulated host (a network namespace, see
hvdps/commands/emulate.py) runs ``slurmd -N hK`` with its own address, the login namespace runs slurmctld and
munged, and every job, step and ``srun`` lands in the namespace of the node SLURM chose, so a job's
traffic crosses the shaped links as on a real cluster. The hosts' names resolve through
``/etc/netns/<namespace>/hosts``, which ``ip netns exec`` mounts over /etc/hosts for everything
started in that namespace (slurmd and the job steps it forks included).

The configuration is the smallest that runs unprivileged-cgroup-free: proctrack/linuxproc,
task/none, select/cons_tres by core, no accounting, and ``SlurmdParameters=config_overrides`` so
each node can declare more CPUs than this machine has (the shapes of the shipped scripts). Every
file (key, configuration, state, spool, logs) lives in one private folder that ``down`` removes with
the daemons; the daemons are processes of the namespaces, so removing those ends them too.
"""
import os
import shutil
import subprocess
import time

from common.base.errors import RunError, UsageError
from common.base.files import write_atomic

SLURM_TOOLS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "salloc", "srun", "sinfo", "scontrol",
               "scancel", "unshare")
NETNS_ETC = "/etc/netns"
SHM = "/dev/shm"
CPUS_PER_NODE = 4


def check_slurm_tools():
    missing = [t for t in SLURM_TOOLS if not shutil.which(t) and not os.path.exists(f"/usr/sbin/{t}")]
    if missing:
        raise UsageError(f"--slurm needs {', '.join(missing)} (Debian: apt-get install slurmctld slurmd "
                         f"slurm-client munge; make setup-slurm)")


def _tool(name):
    return shutil.which(name) or f"/usr/sbin/{name}"


def shm_dir(pid):
    """The shared-memory folder of the lab of emulation ``pid`` (``SlurmLab.task_prolog``)."""
    return os.path.join(SHM, f"hvdps-emulate-{pid}-slurm")


def host_names(count):
    return [f"h{i + 1}" for i in range(count)]


class SlurmLab:
    """SLURM daemons on an EmulatedCluster that is already up."""

    def __init__(self, cluster, cpus_per_node=CPUS_PER_NODE):
        self.cluster = cluster
        self.cpus = cpus_per_node
        self.names = host_names(cluster.count)
        self.dir = os.path.join("/run/hvdps-emulate", f"{os.getpid()}-slurm")
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.socket = os.path.join(self.dir, "munge.socket")
        self.shm = shm_dir(os.getpid())

    def env(self, base=None):
        """What a SLURM client on the login node needs: the configuration, and nothing from an outer job."""
        env = {k: v for k, v in (os.environ if base is None else base).items()
               if not k.startswith(("SLURM_", "SALLOC_", "SBATCH_", "SRUN_"))}
        env["SLURM_CONF"] = self.conf
        return env

    def hosts_file(self):
        lines = ["127.0.0.1 localhost"]
        lines += [f"{addr} {name}" for addr, name in zip(self.cluster.addrs, self.names)]
        lines.append(f"{self.cluster.subnet}.254 login")
        return "\n".join(lines) + "\n"

    def config(self):
        d = self.dir
        nodes = "\n".join(f"NodeName={n} NodeAddr={a} CPUs={self.cpus} RealMemory=2000 State=UNKNOWN"
                          for n, a in zip(self.names, self.cluster.addrs))
        return f"""# written by hvdps/measure/slurm_lab.py for an emulated cluster; removed with it
ClusterName=hvdps
SlurmctldHost=login({self.cluster.subnet}.254)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
TmpFS={d}/tmp/%n
TaskProlog={d}/task_prolog.sh
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=600
PropagateResourceLimitsExcept=ALL
{nodes}
PartitionName=lab Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

    def task_prolog(self):
        """The tasks' Open MPI files in folders of this lab alone.

        The emulated hosts share this machine's /tmp and /dev/shm, and two emulated clusters share
        their host names (h1, h2, ...) and job ids (1, 2, ...). Open MPI names a rank's session
        folder by host (/tmp/ompi.<host>.<uid>) and its shared-memory segment by host, job and local
        rank (/dev/shm/vader_segment.<host>.<uid>.<job>.<rank>, the job from SLURM's PMIx namespace
        'slurm.pmix.<job>.<step>'), so job 1 on one cluster's h1 would map the segment of job 1 on the
        other's: ranks crash or hang. A task prolog's "export" lines set the task's environment
        (slurm.conf: TaskProlog); the segments stay on tmpfs."""
        tmp, shm = f"{self.dir}/tmp/$node/ompi", f"{self.shm}/$node"
        return ("#!/bin/sh\n"
                "node=$(hostname)\n"      # the node's own name (SLURMD_NODENAME can be the batch step's)
                f'mkdir -p "{tmp}" "{shm}"\n'
                f'echo "export OMPI_MCA_orte_tmpdir_base={tmp}"\n'
                f'echo "export OMPI_MCA_btl_vader_backing_directory={shm}"\n')

    def _start(self, ns, argv, name, hostname=None):
        """A daemon in namespace ``ns``; with ``hostname``, in a UTS namespace of its own named so
        (slurmctld accepts only the host SlurmctldHost names; jobs' ``hostname`` is their node's)."""
        log = open(os.path.join(self.dir, f"{name}.out"), "ab")
        if hostname:
            argv = ["unshare", "--uts", "/bin/sh", "-c", 'hostname "$0" && exec "$@"', hostname, *argv]
        try:
            return subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()

    def up(self, timeout=60):
        os.makedirs(os.path.join(self.dir, "state"), mode=0o700, exist_ok=True)
        os.chmod(self.dir, 0o700)
        for ns in [self.cluster.login, *self.cluster.hosts]:
            os.makedirs(os.path.join(NETNS_ETC, ns), exist_ok=True)
            write_atomic(os.path.join(NETNS_ETC, ns, "hosts"), self.hosts_file())
        for name in self.names:
            os.makedirs(os.path.join(self.dir, "spool", name), exist_ok=True)
            os.makedirs(os.path.join(self.dir, "tmp", name), exist_ok=True)
        prolog = os.path.join(self.dir, "task_prolog.sh")
        write_atomic(prolog, self.task_prolog())
        os.chmod(prolog, 0o755)
        key = os.path.join(self.dir, "munge.key")
        subprocess.run([_tool("mungekey"), "--create", "--keyfile", key], check=True, capture_output=True,
                       timeout=30)
        write_atomic(self.conf, self.config())
        # slurmd loads a cgroup plugin whatever proctrack/task say; name the v1 hierarchy this kernel
        # mounts (autodetection looks for cgroup2 or systemd's layout) and constrain nothing with it.
        write_atomic(os.path.join(self.dir, "cgroup.conf"),
                     "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\nConstrainCores=no\nConstrainRAMSpace=no\n"
                     "ConstrainDevices=no\n")
        self._start(self.cluster.login, [_tool("munged"), "--foreground", "--force", f"--socket={self.socket}",
                                         f"--key-file={key}", f"--pid-file={self.dir}/munged.pid",
                                         f"--log-file={self.dir}/munged.log", f"--seed-file={self.dir}/munged.seed"],
                    "munged")
        self._wait(lambda: os.path.exists(self.socket), timeout, "munged did not open its socket")
        self._start(self.cluster.login, [_tool("slurmctld"), "-D", "-i", "-f", self.conf], "slurmctld", "login")
        for ns, name in zip(self.cluster.hosts, self.names):
            self._start(ns, [_tool("slurmd"), "-D", "-N", name, "-f", self.conf], f"slurmd-{name}", name)
        self._wait(self._all_idle, timeout, "the nodes did not come up idle")
        return self

    def _all_idle(self):
        r = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10, check=False)
        states = dict(line.split() for line in r.stdout.splitlines() if len(line.split()) == 2)
        return r.returncode == 0 and all(states.get(n) == "idle" for n in self.names)

    def _wait(self, ready, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.5)
        raise RunError(f"SLURM on the emulated hosts: {what} within {timeout}s; logs in {self.dir}: "
                       + self.log_tail())

    def log_tail(self, lines=5):
        out = []
        for name in ("slurmctld.log", "munged.log", *(f"slurmd-{n}.log" for n in self.names)):
            path = os.path.join(self.dir, name)
            if os.path.exists(path):
                tail = open(path, errors="replace").read().strip().splitlines()[-lines:]
                out.append(f"{name}: " + " | ".join(tail))
        return "; ".join(out)

    def run(self, argv, timeout, check=True, cwd=None, env=None, **kw):
        """A SLURM client command on the login node (sbatch, salloc, sinfo, ...), bounded."""
        r = subprocess.run(["ip", "netns", "exec", self.cluster.login, *argv], capture_output=True, text=True,
                           env=env or self.env(), timeout=timeout, cwd=cwd, stdin=subprocess.DEVNULL, **kw)
        if check and r.returncode:
            raise RunError(f"{' '.join(argv)}: {(r.stderr or r.stdout).strip() or f'exit {r.returncode}'}")
        return r

    def popen(self, argv, cwd=None, env=None, **kw):
        return subprocess.Popen(["ip", "netns", "exec", self.cluster.login, *argv], env=env or self.env(), cwd=cwd,
                                start_new_session=True, **kw)

    def down(self):
        """Remove the hosts files and the private folder; the daemons go with the namespaces."""
        remove_netns_etc([self.cluster.login, *self.cluster.hosts])
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.shm, ignore_errors=True)


def remove_netns_etc(namespaces):
    for ns in namespaces:
        shutil.rmtree(os.path.join(NETNS_ETC, ns), ignore_errors=True)
    try:
        os.rmdir(NETNS_ETC)          # only if empty: another tool's namespaces keep theirs
    except OSError:
        pass
