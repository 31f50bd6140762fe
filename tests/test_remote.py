"""Across hosts without the hosts: placement, commands, host checks, link formulas, the tether."""
import dataclasses
import json
import os
import re
import subprocess
import sys
import time

import pytest

from common.formats.schemas import Gradient, LinksFile

from common.launch import remote
from ps_train.placement import place_ps
from tf_cluster.spec import cluster_addresses
from common.base.errors import UsageError
from hvdps.commands import compare
from hvdps.measure import links
from tests.conftest import REPO, env

HOSTS = [("h1", 1), ("h2", 1), ("h3", 2)]


@pytest.mark.parametrize("hosts, workers, num_ps, placement, chief, want", [
    (HOSTS, 2, 1, "own", False, {"ps": ["h1"], "worker": ["h2", "h3"]}),
    (HOSTS, 3, 1, "own", False, {"ps": ["h1"], "worker": ["h2", "h3", "h3"]}),
    (HOSTS, 2, 2, "own", False, {"ps": ["h1", "h2"], "worker": ["h3", "h3"]}),
    (HOSTS, 2, 2, "beside", False, {"ps": ["h1", "h2"], "worker": ["h1", "h2"]}),
    (HOSTS, 4, 3, "beside", False, {"ps": ["h1", "h2", "h3"], "worker": ["h1", "h2", "h3", "h3"]}),
    (HOSTS, 1, 1, "own", True, {"ps": ["h1"], "worker": ["h2"], "chief": ["h2"]}),
])
def test_place_ps(hosts, workers, num_ps, placement, chief, want):
    assert place_ps(hosts, workers, num_ps, placement, chief) == want


@pytest.mark.parametrize("hosts, workers, num_ps, placement, message", [
    ([("h1", 4)], 2, 1, "own", "only worker host"),
    (HOSTS, 4, 1, "own", "3 slot(s) beside the PS host(s), 4 workers"),
    (HOSTS, 5, 1, "beside", "4 slot(s) in all, 5 workers"),
    (HOSTS, 1, 1, "elsewhere", "--ps_placement must be one of"),
])
def test_place_ps_refuses(hosts, workers, num_ps, placement, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        place_ps(hosts, workers, num_ps, placement)


def test_cluster_addresses_count_ports_per_host():
    roles = {"ps": ["h1"], "worker": ["h2", "h2"], "chief": ["h2"]}
    assert cluster_addresses(roles, 2222) == {"ps": ["h1:2222"], "worker": ["h2:2222", "h2:2223"],
                                                     "chief": ["h2:2224"]}


@pytest.mark.parametrize("text, want", [
    ("h1,h2:3", [("h1", 1), ("h2", 3)]),
    ("10.0.0.1:2", [("10.0.0.1", 2)]),
])
def test_resolve_hosts(text, want):
    assert remote.resolve_hosts(text) == want


@pytest.mark.parametrize("text, message", [
    ("h1,h1", "listed twice"),
    ("localhost,LOCALHOST", "host LOCALHOST listed twice"),        # host names are case-insensitive
    ("h1,,h2", "empty entry"),
    ("h1:0", "positive integer"),
    ("bad_host!", "invalid host name"),
    ("/nonexistent/hostfile", "cannot read hostfile"),
])
def test_resolve_hosts_refuses(text, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        remote.resolve_hosts(text)


def test_hostfile_and_slurm_forms(tmp_path, monkeypatch):
    path = tmp_path / "hosts"
    path.write_text("# two nodes\nnode1 slots=2\nnode2 slots=2\n")
    assert remote.resolve_hosts(str(path)) == [("node1", 2), ("node2", 2)]
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text("#!/bin/sh\necho n01; echo n02; echo n03\n")
    (fake / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    assert remote.slurm_hosts({"SLURM_JOB_NODELIST": "n[01-03]", "SLURM_TASKS_PER_NODE": "2(x2),1"}) == \
        [("n01", 2), ("n02", 2), ("n03", 1)]
    with pytest.raises(UsageError, match="not inside a SLURM allocation"):
        remote.slurm_hosts({})


def test_remote_command_runs_here_as_it_would_there(tmp_path):
    line = remote.remote_command([sys.executable, "-c", "import os, sys; print(os.getcwd()); print(sys.path[1])"],
                                 tether=False)
    out = subprocess.run(["/bin/sh", "-c", line], capture_output=True, text=True, timeout=60).stdout.split()
    assert out[0] == REPO


def call(argv):
    """hvdps compare's exit code, as the shell would see it."""
    try:
        return compare.main(argv)
    except SystemExit as exc:
        return exc.code


DRY = ["--workers", "2", "--dry-run", "--network-interface", "10.9.0.0/24", "--out", "/tmp/hvdps-dry"]


@pytest.mark.parametrize("extra, message", [
    (["--hosts", "h1,h1"], "listed twice"),
    (["--hosts", "h1:1", "--backends", "horovod"], "1 slot(s) in all, 2 workers"),
    (["--hosts", "h1:4", "--backends", "ps"], "only worker host"),
    (["--hosts", "h1,h2,h3", "--port", "70000"], "--port must be"),
    (["--rsh", "ssh"], "--rsh applies only with --hosts"),
    (["--ps_placement", "beside"], "--ps_placement applies only with --hosts"),
    (["--port", "3000"], "--port applies only with --hosts"),
    (["--hosts", "h1,h2,h3", "--rsh", "no-such-agent-here"], "is not an executable"),
    (["--hosts", "h1,h2,h3", "--rsh", "ssh -o 'ProxyCommand=x"], "argument --rsh: cannot split"),
    (["--hosts", "h1,h2,h3", "--rsh", " "], "argument --rsh: empty"),
    (["--network_interface", "300.1.1.1/99"], "'300.1.1.1/99' is not a network in CIDR notation"),
    (["--network_interface", "10.0.0.300"], "'10.0.0.300' is not a network in CIDR notation"),
    (["--network_interface", "eth0; reboot"], "is neither an interface name"),
])
def test_compare_hosts_usage_errors(extra, message, capsys):
    assert call([*DRY, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err


def test_dry_run_shows_each_host_and_its_command(capsys):
    assert call([*DRY, "--hosts", "h1,h2,h3", "--backends", "horovod,ps:sync", "--rsh", "/bin/true"]) == 0
    out = capsys.readouterr().out
    assert "# horovod-sync-w2: rank:0 on h1, rank:1 on h2" in out
    assert "-H h1:1,h2:1" in out and "btl_tcp_if_include 10.9.0.0/24" in out and "plm_rsh_agent /bin/true" in out
    assert "# ps-sync-w2-ps1: ps:0 on h1, worker:0 on h2, worker:1 on h3" in out
    for task, host in (("ps:0", "h1"), ("worker:0", "h2"), ("worker:1", "h3")):
        line = next(l for l in out.splitlines() if l.startswith(f"#   {task}:"))
        assert f"/bin/true {host} " in line and "-m common.launch.tether" in line and "--ps_hosts=h1:2222" in line


@pytest.mark.parametrize("environ, want", [
    ({}, ["--mca", "btl_tcp_eager_limit", "4194304"]),      # the ring's blocks without a handshake
    ({"OMPI_MCA_btl_tcp_eager_limit": "65536"}, []),        # the user's own limit reaches every rank
])
def test_remote_mpi_flags_eager_limit(environ, want):
    """The ring's blocks above TCP's eager limit wait for the receiver's answer (BENCHMARKS.md section 15);
    a --mca flag beats an OMPI_MCA_ variable, so hvdps sets the limit only where the user has not."""
    from hvdps.launchers import Remote, remote_mpi_flags
    where = Remote("h1,h2", (("h1", 1), ("h2", 1)), ("ssh",), False, "10.9.0.0/24")
    flags = remote_mpi_flags(where, environ)
    got = [flags[i:i + 3] for i, f in enumerate(flags) if f == "--mca" and flags[i + 1] == "btl_tcp_eager_limit"]
    assert got == ([want] if want else [])
    assert "btl_tcp_links" in flags and "plm_rsh_agent" not in flags


def test_dry_run_shows_each_mwms_worker_on_its_slot(capsys):
    """TF's all-reduce across hosts: workers fill the slots in order (as mpirun's ranks), ports count
    up on a host, and every worker's line names the whole cluster and its own index."""
    assert call([*DRY, "--workers", "3", "--hosts", "h1:2,h2", "--backends", "mwms", "--rsh", "/bin/true"]) == 0
    out = capsys.readouterr().out
    assert "# mwms-sync-w3: rank:0 on h1, rank:1 on h1, rank:2 on h2" in out
    for i, host in enumerate(("h1", "h1", "h2")):
        line = next(l for l in out.splitlines() if l.startswith(f"#   worker:{i}:"))
        assert f"/bin/true {host} " in line and "-m common.launch.tether" in line and "-m mwms_train.main" in line
        assert "--worker_hosts=h1:2222,h1:2223,h2:2222" in line and f"--task_index={i}" in line


def test_unreachable_host_is_named_before_anything_runs(tmp_path, capsys):
    agent = tmp_path / "agent"
    agent.write_text('#!/bin/sh\n[ "$1" = h2 ] && { echo "ssh: connect to host h2 port 22: No route to host" >&2; '
                     'exit 255; }\nshift; exec /bin/sh -c "$*"\n')
    agent.chmod(0o755)
    code = call(["--hosts", "h1,h2,h3", "--rsh", str(agent), "--network-interface", "lo", "--workers", "2",
                         "--backends", "ps:sync", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: host h2: ssh: connect to host h2"), err
    assert not os.path.exists(tmp_path / "out" / "runs")           # nothing was started


def test_host_without_the_shared_run_directory_is_named(tmp_path, capsys):
    agent = tmp_path / "agent"        # h3 sees another filesystem: the token file is not there
    agent.write_text('#!/bin/sh\nh=$1; shift\n[ "$h" = h3 ] && exec /bin/sh -c "cd /tmp && '
                     'test -f /nonexistent || { echo \'cannot see the run directory\'; exit 3; }"\n'
                     'exec /bin/sh -c "$*"\n')
    agent.chmod(0o755)
    code = call(["--hosts", "h1,h2,h3", "--rsh", str(agent), "--network-interface", "lo", "--workers", "2",
                         "--backends", "ps:sync", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["error: host h3: cannot see the run directory"], err


def test_a_hung_remote_shell_is_refused_in_time_and_leaves_nothing(tmp_path):
    """An agent that never answers (and started a child that holds its output open): the probe is
    refused after its time-out, and the agent's whole process group goes with it."""
    marker = f"hvdps-hung-agent-{os.getpid()}"
    agent = tmp_path / "agent"
    wait = f'{sys.executable} -c "import time; time.sleep(300)" {marker}'
    agent.write_text(f"#!/bin/sh\n{wait} &\nexec {wait}\n")
    agent.chmod(0o755)
    t0 = time.monotonic()
    with pytest.raises(UsageError, match=r"host h1: no answer through .*agent within 2s"):
        remote.check_hosts([("h1", 1)], [str(agent)], str(tmp_path / "out"), timeout=2)
    assert time.monotonic() - t0 < 10
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert left == [], left
    assert os.listdir(tmp_path / "out") == []          # the probe's token is gone too


GRADIENT = Gradient(dense_bytes=1000, sparse_bytes=0, sparse_table_bytes=0)


@pytest.mark.parametrize("backend, mode, roles, shards, want", [
    # ring: 2(n-1)/n x M each way on every host with ranks
    ("horovod", "sync", {"rank:0": "a", "rank:1": "b"}, None, {"a": 1000, "b": 1000}),
    ("mpi", "sync", {"rank:0": "a", "rank:1": "b", "rank:2": "c", "rank:3": "d"}, None,
     {h: 1500 for h in "abcd"}),
    ("horovod", "sync", {"rank:0": "a", "rank:1": "a"}, None, {"a": 0}),        # one host: shared memory only
    # one PS: n x M on its link, M on each worker's
    ("ps", "sync", {"ps:0": "p", "worker:0": "a", "worker:1": "b", "worker:2": "c"}, None,
     {"p": 3000, "a": 1000, "b": 1000, "c": 1000}),
    # two shards as placed: each carries its share times n
    ("ps", "async", {"ps:0": "p", "ps:1": "q", "worker:0": "a", "worker:1": "b"}, {"ps:0": 750, "ps:1": 250},
     {"p": 1500, "q": 500, "a": 1000, "b": 1000}),
    # a PS beside a worker: that worker's traffic to it stays on the host
    ("ps", "sync", {"ps:0": "a", "worker:0": "a", "worker:1": "b"}, None, {"a": 1000, "b": 1000}),
])
def test_link_formulas(backend, mode, roles, shards, want):
    got = links.predicted(backend, mode, roles, GRADIENT, shards)
    assert {h: v["in"] for h, v in got.items()} == pytest.approx(want)
    assert {h: v["out"] for h, v in got.items()} == pytest.approx(want)


def test_measured_bytes_per_round_from_counter_samples():
    data = LinksFile(series={"a": [[10.0, 0, 0], [11.0, 1000, 2000], [13.0, 3000, 6000]]})
    got = links.measured(data, (10.5, 12.0), rounds=4)
    assert got["a"] == {"in": pytest.approx((2000 - 500) / 4), "out": pytest.approx((4000 - 1000) / 4)}
    assert links.measured(data, (9.0, 12.0), rounds=4) is None          # counters do not cover the interval


def test_read_net_dev(tmp_path):
    path = tmp_path / "dev"
    path.write_text("Inter-|   Receive  |  Transmit\n face |bytes packets errs drop fifo frame compressed "
                    "multicast|bytes packets\n    h1: 1234 5 0 0 0 0 0 0 5678 9 0 0 0 0 0 0\n")
    assert links.read_net_dev(str(path)) == {"h1": (1234, 5678)}


def test_read_cpu(tmp_path):
    path = tmp_path / "stat"
    path.write_text("cpu  100 5 20 800 10 1 2 3 0 0\ncpu0 50 2 10 400 5 0 1 1 0 0\n")
    assert links.read_cpu(str(path)) == (100 + 5 + 20 + 1 + 2 + 3, 100 + 5 + 20 + 1 + 2 + 3 + 800 + 10)
    assert links.read_cpu_steal(str(path)) == (*links.read_cpu(str(path)), 3)     # steal: the 8th column
    path.write_text("intr 1 2 3\n")
    with pytest.raises(OSError):
        links.read_cpu(str(path))


@pytest.mark.parametrize("cpu, interval, want", [
    ([[10.0, 0, 0], [12.0, 300, 400]], (10.0, 12.0), 0.75),
    ([[10.0, 0, 0], [11.0, 100, 200], [13.0, 500, 600]], (10.5, 12.0), (300 - 50) / (400 - 100)),
    ([[10.0, 0, 0], [12.0, 300, 400]], (9.0, 12.0), None),            # samples do not cover the interval
    ([], (10.0, 12.0), None),                                           # a links file from before the record
    ([[10.0, 5, 5], [12.0, 5, 5]], (10.0, 12.0), None),                 # no ticks counted: no share
])
def test_cores_busy_over_the_measured_interval(cpu, interval, want):
    got = links.cores_busy(LinksFile(series={}, cpu=cpu), interval)
    assert got == (None if want is None else pytest.approx(want))


def test_sampler_records_the_cores_beside_the_links(tmp_path):
    dev = tmp_path / "dev"
    dev.write_text("Inter-|\n face |\n    p1: 10 0 0 0 0 0 0 0 20 0 0 0 0 0 0 0\n")
    with links.Sampler(str(dev), {"h1": "p1"}, every=0.01) as s:
        time.sleep(0.05)
    s.save(str(tmp_path), {"roles": {"rank:0": "h1"}})
    from common.formats.schemas import read_links
    saved = read_links(str(tmp_path / links.LINKS_FILE))
    assert len(saved.cpu) >= 2 and saved.cores == os.cpu_count()
    assert all(b <= t for _, b, t in saved.cpu) and saved.cpu[-1][2] >= saved.cpu[0][2]
    assert saved.series["h1"][0][1:] == [20, 10]                     # the host's in is the port's transmit


@pytest.mark.process
def test_tether_ends_the_command_when_its_connection_closes(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "common.launch.tether", sys.executable, "-c",
                          "import time; print('up', flush=True); time.sleep(120)"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env(), cwd=REPO)
    try:
        assert p.stdout.readline().strip() == "up"
        assert b"time.sleep(120)" in open(f"/proc/{p.pid}/cmdline", "rb").read()   # the command kept the pid
        started = time.monotonic()
        p.stdin.close()                              # what a dropped ssh session does to the remote side
        assert p.wait(timeout=15) != 0 and time.monotonic() - started < 10
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.stdout.read() == ""                     # the watcher left no writer behind


def test_a_slow_link_is_the_fullest_and_the_report_names_it(tmp_path):
    """hvdps emulate --link: the links file carries each host's own rate; the run's link use is the
    link nearest its own rate (the slow one here, though the other carries more), named beside the
    busiest, and the report's header says which host's link differs."""
    from common.spec.config import make_config
    from common.spec.plan import make_plan
    from common.trainer.metrics import MetricsWriter
    from hvdps.measure.runs import links_of
    from hvdps.measure.rows import load_run
    from hvdps.render.report import links_section
    run = tmp_path / "run"
    w = MetricsWriter(str(run))
    cfg = make_config(batch_size=10, warmup_steps=1)
    w.header(cfg, "ps", "sync", 2, {"ps": 1}, make_plan(cfg, 1000, 2, 2))
    for step in range(1, 4):                         # the first is the warm-up: the interval starts there
        time.sleep(0.05)
        w.step(step, 20 * step, 1.0, 400.0 if step > 1 else None)
    w.summary("ok", 3, 60, {}, 1.0, 0.5, 1000)
    w.close()
    row = load_run(str(run))
    begin, end = (row.header.start_time + s.wall_time for s in (row.curves.steps[0], row.curves.steps[-1]))
    rounds = 2                                       # (60 - 20) samples over 2 workers of 10
    series = {"h1": [[begin, 0, 0], [end, 2_000_000 * rounds, 2_000_000 * rounds]],       # 2 MB a round
              "h2": [[begin, 0, 0], [end, 1_000_000 * rounds, 1_000_000 * rounds]]}       # 1 MB, on a 10x slower link
    (run / links.LINKS_FILE).write_text(json.dumps({"series": series, "roles": {"ps:0": "h1", "worker:0": "h2"},
                                                    "rate_bps": 1e9, "rates": {"h1": 1e9, "h2": 1e8}}))
    placed = links_of(row, {"ps:0": "h1", "worker:0": "h2"})
    got = placed.links
    round_s = (end - begin) / rounds
    assert got.busiest_link == "h1" and got.fullest_link == "h2" and got.fullest_link_bps == 1e8
    assert got.link_utilisation == pytest.approx(1_000_000 * 8 / round_s / 1e8)
    assert placed.roles == {"ps:0": "h1", "worker:0": "h2"} and [x.host for x in got.hosts] == ["h1", "h2"]
    text = "\n".join(links_section([placed]))
    assert "Each link: 1000 Mbit/s both ways; h2's own, 100 Mbit/s." in text
    assert "(h2's own)" in text
