"""The kernel's CPU controller a slow worker is held by: cgroup v1's ``cpu`` hierarchy where it is
mounted writable (or mounted privately in a comparison's own mount namespace), else cgroup v2's
``cpu.max``; one group per run, named for the comparison that made it, so a group a killed
comparison left is removed at the next start."""
import errno
import glob
import math
import os
import re
import subprocess
import time

from common.base.errors import UsageError
from common.base.procs import exists
from common.base.numbers import whole

# CFS bandwidth control runs a group for its quota, then holds it to the period's end: with the default
# 100 ms period a worker at 1/4 runs 25 ms and stops 75 ms, a stall more than a slow CPU. 10 ms keeps
# that to a few steps of a small model; longer only where the quota would fall below the kernel's 1 ms.
PERIOD_US = 10_000
MIN_QUOTA_US = 1_000
GROUP_PREFIX = "hvdps-"           # hvdps-<comparison pid>-<run>: who made it, so a stale one can go
PRIVATE_MOUNT = "/run/hvdps-cgroup-cpu-"   # + pid: where a comparison in a namespace mounts the cpu hierarchy


class CpuController:
    """One cgroup CPU controller: v1 (``cpu.cfs_quota_us``) or v2 (``cpu.max``) at ``root``."""

    def __init__(self, root, version, mounted=False):
        self.root, self.version, self.mounted = root, version, mounted

    @classmethod
    def find(cls, v1="/sys/fs/cgroup/cpu", mounts="/proc/mounts", own="/proc/self/cgroup", private=None):
        """This machine's writable CPU controller, or a usage error that says what is missing: the v1
        ``cpu`` hierarchy at ``v1`` or wherever /proc/mounts has it (``cpu,cpuacct`` on many hosts),
        else a cgroup2 mount that offers ``cpu``.

        Inside ``ip netns exec`` (hvdps emulate runs the comparison there) a fresh /sys hides the
        cgroup mounts. There, in a mount namespace of its own, as root, the v1 hierarchy this process
        belongs to is mounted again at ``private``: the same hierarchy, so its groups are the machine's.
        Never in the machine's own mount namespace."""
        table = _mounts(mounts)
        for path, kind, options in [(v1, "cgroup", ["cpu"])] + table:
            if kind == "cgroup" and "cpu" in options and _writable(path, "cpu.cfs_quota_us"):
                return cls(path, 1)
        for path, kind, _ in table:
            if kind == "cgroup2" and "cpu" in _words(os.path.join(path, "cgroup.controllers")) \
                    and os.access(path, os.W_OK):
                return cls(path, 2)
        hierarchy = _v1_cpu_hierarchy(own)
        private = private or f"{PRIVATE_MOUNT}{os.getpid()}"
        if hierarchy and os.geteuid() == 0 and _own_mount_namespace() and _mount_cpu(private, hierarchy):
            return cls(private, 1, mounted=True)
        raise UsageError("--straggler needs the kernel's CPU controller writable (cgroup v1 cpu.cfs_quota_us "
                         f"at {v1}, or a cgroup2 mount with the cpu controller): run as root on such a machine")

    def create(self, name, quota_us, period_us=PERIOD_US):
        """A new group ``name`` limited to ``quota_us`` of CPU time per ``period_us``; its path."""
        path = os.path.join(self.root, name)
        os.mkdir(path)
        try:
            if self.version == 1:
                _write(os.path.join(path, "cpu.cfs_period_us"), period_us)
                _write(os.path.join(path, "cpu.cfs_quota_us"), quota_us)
            else:
                if "cpu" not in open(os.path.join(self.root, "cgroup.subtree_control")).read().split():
                    _write(os.path.join(self.root, "cgroup.subtree_control"), "+cpu")
                _write(os.path.join(path, "cpu.max"), f"{quota_us} {period_us}")
        except BaseException:
            self.remove(path)
            raise
        return path

    def add(self, path, pid):
        """Move process ``pid`` (every thread of it) into the group; False when it has gone."""
        try:
            _write(os.path.join(path, "cgroup.procs"), pid)
            return True
        except OSError as exc:
            if exc.errno in (errno.ESRCH, errno.ENOENT):
                return False
            raise

    def members(self, path):
        try:
            return [int(p) for p in open(os.path.join(path, "cgroup.procs")).read().split()]
        except OSError:
            return []

    def remove(self, path, attempts=50):
        """Move what is still in the group back to the root, then remove it (bounded: a process that
        is just exiting leaves the group a moment later)."""
        for _ in range(attempts):
            for pid in self.members(path):
                self.add(self.root, pid)
            try:
                os.rmdir(path)
                return True
            except FileNotFoundError:
                return True
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
            time.sleep(0.02)
        return False

    def close(self):
        """Unmount the hierarchy ``find`` mounted itself, and remove its mount point."""
        if self.mounted:
            subprocess.run(["umount", self.root], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)
            try:
                os.rmdir(self.root)
            except OSError:
                pass
            self.mounted = False

    def remove_stale(self, prefix=GROUP_PREFIX):
        """Remove the groups a comparison that is no longer running left (its pid is in the name), and
        the mount points such a comparison made inside an emulated cluster."""
        for path in glob.glob(PRIVATE_MOUNT + "*"):
            pid = path[len(PRIVATE_MOUNT):]
            if whole(pid) is not None and not exists(whole(pid)) and path != self.root:
                try:
                    os.rmdir(path)          # the namespace that mounted it has gone: an empty folder here
                except OSError:
                    pass
        try:
            names = os.listdir(self.root)
        except OSError:
            return []
        gone = []
        for name in names:
            m = re.match(re.escape(prefix) + r"(\d+)-", name)
            if m and not exists(int(m.group(1))) and os.path.isdir(os.path.join(self.root, name)):
                if self.remove(os.path.join(self.root, name)):
                    gone.append(name)
        return gone


def _mounts(path):
    """[(mount point, type, options)] of the cgroup mounts in ``path`` (/proc/mounts' format)."""
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 4 and fields[2] in ("cgroup", "cgroup2"):
            out.append((fields[1].replace("\\040", " "), fields[2], fields[3].split(",")))
    return out


def _words(path):
    try:
        return open(path).read().split()
    except OSError:
        return []


def _writable(folder, name):
    return os.access(os.path.join(folder, name), os.R_OK) and os.access(folder, os.W_OK)


def _v1_cpu_hierarchy(own):
    """The controllers of the v1 hierarchy with ``cpu`` this process sits in ("cpu" or "cpu,cpuacct";
    /proc/self/cgroup), or None."""
    try:
        lines = open(own).read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":")
        if len(parts) >= 3 and "cpu" in parts[1].split(","):
            return parts[1]
    return None


def _own_mount_namespace(proc="/proc"):
    """True when this process's mount namespace differs from one of its ancestors' (``ip netns exec``
    makes one for the command it runs); init's own link may not be readable, even to root."""
    try:
        mine = os.readlink(os.path.join(proc, "self", "ns", "mnt"))
    except OSError:
        return False
    pid = os.getpid()
    for _ in range(64):
        try:
            stat = open(os.path.join(proc, str(pid), "stat")).read()
        except OSError:
            return False
        pid = int(stat[stat.rindex(")") + 2:].split()[1])
        if pid <= 1:
            return False
        try:
            if os.readlink(os.path.join(proc, str(pid), "ns", "mnt")) != mine:
                return True
        except OSError:
            return False
    return False


def _mount_cpu(path, hierarchy):
    """Mount the v1 hierarchy of ``hierarchy``'s controllers at ``path`` (root, in this mount
    namespace); whether it worked."""
    try:
        os.makedirs(path, exist_ok=True)
        if not os.path.exists(os.path.join(path, "cpu.cfs_quota_us")):
            subprocess.run(["mount", "-t", "cgroup", "-o", hierarchy, "hvdps-cpu", path], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)
        return os.path.exists(os.path.join(path, "cpu.cfs_quota_us"))
    except (OSError, subprocess.SubprocessError):
        try:
            os.rmdir(path)
        except OSError:
            pass
        return False


def _write(path, value):
    with open(path, "w") as f:
        f.write(str(value))


def quota_us(factor, cores, tasks):
    """(CPU time per period, the period) in microseconds for a worker at 1/``factor`` of an even share of
    ``cores`` among ``tasks`` processes (at most one core each: a worker of a job that fits gets a core)."""
    share = min(1.0, cores / max(1, tasks))
    period = max(PERIOD_US, math.ceil(MIN_QUOTA_US * factor / share))
    return int(round(period * share / factor)), period


