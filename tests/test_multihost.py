"""A real multi-host run: 3 'hosts' in network namespaces, each with its own address.

Topology (created here, removed at the end, also on failure):

    ns <id>-h1 (10.199.X.1) --veth--+
    ns <id>-h2 (10.199.X.2) --veth--+-- bridge in ns <id>-sw
    ns <id>-h3 (10.199.X.3) --veth--+

The addresses exist only inside these namespaces, so no packet can leave them.
Skipped (with the reason) only where namespaces cannot be created (not root).
"""
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, env, row_and_records

pytestmark = pytest.mark.root

AGENT = os.path.join(REPO, "hvdps", "measure", "netns_agent.sh")


def sh(*argv, check=True):
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r


class Hosts:
    def __init__(self, count=3):
        tag = f"hv{os.getpid() % 100000}"
        self.subnet = f"10.199.{random.randint(1, 250)}"
        self.sw = f"{tag}-sw"
        self.names = [f"{tag}-h{i + 1}" for i in range(count)]
        self.addrs = [f"{self.subnet}.{i + 1}" for i in range(count)]
        self.created = []

    def up(self):
        sh("ip", "netns", "add", self.sw)
        self.created.append(self.sw)
        sh("ip", "-n", self.sw, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.sw, "link", "set", "br0", "up")
        for i, (ns, addr) in enumerate(zip(self.names, self.addrs)):
            sh("ip", "netns", "add", ns)
            self.created.append(ns)
            sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{i}", "netns", self.sw)
            sh("ip", "-n", self.sw, "link", "set", f"p{i}", "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        return self

    def down(self):
        for ns in self.created:
            for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        time.sleep(0.2)
        for ns in reversed(self.created):
            sh("ip", "netns", "del", ns, check=False)

    def popen(self, i, argv, **extra):
        return subprocess.Popen(["ip", "netns", "exec", self.names[i], *argv], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env(**extra), cwd=REPO,
                                start_new_session=True)


@pytest.fixture
def hosts():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    h = Hosts()
    try:
        h.up()
    except (RuntimeError, FileNotFoundError) as exc:
        h.down()
        pytest.skip(f"cannot create network namespaces here: {exc}")
    try:
        yield h
    finally:
        h.down()
    assert not any(ns in sh("ip", "netns", "list").stdout for ns in h.created)


def finish(procs, timeout):
    outs, deadline = [], time.monotonic() + timeout
    try:
        for p in procs:
            outs.append(p.communicate(timeout=max(1, deadline - time.monotonic()))[0])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
    return outs


def test_ps_across_three_hosts(hosts, tmp_path):
    ps = f"{hosts.addrs[0]}:2222"
    workers = f"{hosts.addrs[1]}:2222,{hosts.addrs[2]}:2222"
    common = [sys.executable, os.path.join(REPO, "ps_train", "main.py"), f"--ps_hosts={ps}",
              f"--worker_hosts={workers}", "--epochs", "4", "--batch_size", "32", "--sync",
              "--train_dir", str(tmp_path / "run"), "--startup_timeout", "60"]
    procs = [hosts.popen(0, common + ["--job_name=ps", "--task_index=0"]),
             hosts.popen(1, common + ["--job_name=worker", "--task_index=0"]),
             hosts.popen(2, common + ["--job_name=worker", "--task_index=1"])]
    outs = finish(procs, 300)
    assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(o[-2000:] for o in outs)
    row, curves = row_and_records(str(tmp_path / "run"))
    assert row.final_test_accuracy >= 0.9
    assert curves["header"]["cluster"]["worker"] == workers.split(",")
    assert curves["summary"]["worker_steps"][1] > 0          # the worker on the third host trained


def test_horovod_mpirun_across_two_hosts(hosts, tmp_path):
    argv = ["mpirun", "--allow-run-as-root", "-np", "2", "-H", f"{hosts.addrs[0]}:1,{hosts.addrs[1]}:1",
            "--mca", "plm_rsh_agent", AGENT, "--mca", "btl", "self,tcp",
            "--mca", "btl_tcp_if_include", f"{hosts.subnet}.0/24", "--mca", "oob_tcp_if_include",
            f"{hosts.subnet}.0/24", "-bind-to", "none", "-map-by", "slot",
            "-x", "PATH", "-x", "PYTHONPATH", "-x", "TF_CPP_MIN_LOG_LEVEL", "-x", "HOROVOD_HOSTNAME_CHECK",
            sys.executable, os.path.join(REPO, "horovod_train", "main.py"), "--epochs", "4",
            "--batch_size", "32", "--train_dir", str(tmp_path / "run")]
    p = hosts.popen(0, argv, HVDPS_NETNS_MAP=",".join(f"{a}={n}" for a, n in zip(hosts.addrs, hosts.names)))
    out = finish([p], 300)[0]
    assert p.returncode == 0, out[-4000:]
    row, curves = row_and_records(str(tmp_path / "run"))
    assert row.workers == 2 and row.final_test_accuracy >= 0.9
    assert curves["summary"]["max_weight_divergence"] == 0.0


def test_compare_launched_from_one_of_the_hosts(hosts, tmp_path):
    """The everyday cluster case: the comparison runs on a host that is itself one of --hosts (a head node,
    the first node of a batch job). This machine's own address routes through lo there; Open MPI's traffic
    must still be kept on the hosts' network (found from the interface holding the address), or the
    daemon on the other host cannot call back. No --network-interface given: the launch finds it."""
    out = tmp_path / "cmp"
    argv = [os.path.join(os.path.dirname(sys.executable), "hvdps"), "compare", "--hosts",
            f"{hosts.addrs[0]}:1,{hosts.addrs[1]}:1", "--rsh", AGENT, "--backends", "horovod", "--workers", "2",
            "--epochs", "2", "--batch_size", "32", "--probe_steps", "0", "--no-progress", "--run_timeout", "240",
            "--out", str(out)]
    p = hosts.popen(0, argv, HVDPS_NETNS_MAP=",".join(f"{a}={n}" for a, n in zip(hosts.addrs, hosts.names)))
    text = finish([p], 300)[0]
    assert p.returncode == 0, text[-4000:]
    results = json.loads((out / "results.json").read_text())
    rows = results["rows"] if isinstance(results, dict) else results
    assert [(r["backend"], r["workers"], r["status"]) for r in rows] == [("horovod", 2, "ok")], rows
    command = json.loads(next((out / "runs").glob("horovod-*/compare_run.json")).read_text())["command"]
    flag = command.index("oob_tcp_if_include")
    assert command[flag + 1] == f"{hosts.subnet}.0/24", command
    assert row_host_count(out) == 2


def row_host_count(out):
    """How many hosts the run's ranks were placed on, from its record."""
    record = json.loads(next((out / "runs").glob("horovod-*/compare_run.json")).read_text())
    return len(set((record.get("roles") or {}).values()))


def test_own_address_gives_the_hosts_network_not_loopback(hosts):
    """On a host, its own cluster address routes through lo; the network is the interface's that holds it."""
    code = ("from common.launch.remote import local_network_of, mpi_network; "
            f"print(local_network_of('{hosts.addrs[0]}'), local_network_of('127.0.0.1'), "
            f"mpi_network([('{hosts.addrs[0]}', 1)]))")
    p = hosts.popen(0, [sys.executable, "-c", code])
    text = finish([p], 60)[0]
    assert p.returncode == 0, text
    assert text.split()[-3:] == [f"{hosts.subnet}.0/24", "127.0.0.0/8", f"{hosts.subnet}.0/24"], text
