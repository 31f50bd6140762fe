"""hvdps/measure/unhealthy.py and compare's --straggler / --stall: the flags' parsers, which process
is worker R for each launcher, the kernel's CPU cgroup, and a comparison with a slow and a stalled
worker (what each method keeps of itself, and nothing left behind, also when it is killed)."""
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings, strategies as st

from common.base.errors import UsageError
from common.formats.schemas import LinksSpec, StepQuantiles, Unhealthy
from conftest import BIN, REPO, check_timeline, env, living, run, stopped
from hvdps.launchers import MPIRunLauncher, TaskLauncher
from hvdps.measure import unhealthy
from hvdps.measure.rows import RunRow
from hvdps.render import unhealthy as unhealthy_report
from hvdps.measure import cgroups, conditions as cond
from hvdps.measure.cgroups import CpuController, quota_us
from hvdps.measure.conditions import SlowLink, Stall, Straggler, parse_slow_links, parse_stall, parse_stragglers
from tf_cluster.spec import task_of

V1 = "/sys/fs/cgroup/cpu"


@pytest.mark.parametrize("text, want", [
    ("1:4", [Straggler(1, 4.0)]),
    ("1:1,1:2, 1:4", [Straggler(1, 1.0), Straggler(1, 2.0), Straggler(1, 4.0)]),
    ("0:1.5,0:1.5", [Straggler(0, 1.5)]),
])
def test_straggler_specs(text, want):
    assert parse_stragglers(text) == want


@pytest.mark.parametrize("text, words", [
    ("1", "RANK:FACTOR"), ("1:", "RANK:FACTOR"), ("a:4", "the rank must be a whole number"),
    ("1:0.5", "must be in [1, 1000]"), ("1:nan", "must be in"), ("1:inf", "must be in"), ("-1:4", "the rank must be in"),
    ("1:4:2", "the slowdown factor must be a number"),
])
def test_bad_straggler_specs_are_refused_in_one_line(text, words):
    with pytest.raises(UsageError) as exc:
        parse_stragglers(text)
    assert words in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("text, want", [("1:2000:500", Stall(1, 2000.0, 500.0)), ("0:10:1", Stall(0, 10.0, 1.0))])
def test_stall_specs(text, want):
    assert parse_stall(text) == want


@pytest.mark.parametrize("text, words", [
    ("1:500", "RANK:EVERY_MS:FOR_MS"), ("1:500:500", "must be shorter"), ("1:100:0", "FOR_MS must be in"),
    ("x:100:10", "the rank must be a whole number"), ("1:1e9:10", "EVERY_MS must be in"),
])
def test_bad_stall_specs_are_refused_in_one_line(text, words):
    with pytest.raises(UsageError) as exc:
        parse_stall(text)
    assert words in str(exc.value)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30))
def test_any_text_is_a_spec_or_one_usage_error(text):
    for parse in (parse_stragglers, parse_stall, parse_slow_links):
        try:
            parse(text)
        except UsageError as exc:
            assert "\n" not in str(exc)


def test_conditions_run_healthy_first_and_factor_one_is_healthy():
    s = parse_stragglers("1:1,1:4")
    stall = parse_stall("1:1000:200")
    links = parse_slow_links("h3=10mbit")
    assert cond.conditions(s, stall, links) == [None, Straggler(1, 4.0), stall, SlowLink("h3", "10mbit")]
    assert [c.label for c in cond.conditions(s, stall, links)[1:]] == ["slow1x4", "stall1-1000-200",
                                                                             "link-h3-10mbit"]
    # a worker's condition is in the runs that have the worker; a host's link in every run
    assert [c.applies_to(2) for c in (Straggler(1, 4.0), stall, links[0])] == [True, True, True]
    assert [c.applies_to(1) for c in (Straggler(1, 4.0), stall, links[0])] == [False, False, True]


@pytest.mark.parametrize("text, want", [
    ("h3=10mbit", [SlowLink("h3", "10mbit")]),
    ("h2=10Mbit, h2=500kbit,h2=10mbit", [SlowLink("h2", "10mbit"), SlowLink("h2", "500kbit")]),
])
def test_slow_link_specs(text, want):
    got = parse_slow_links(text)
    assert got == want
    assert got[0].describe() == f"{want[0].port}'s link at 10 Mbit/s"


@pytest.mark.parametrize("text, words", [
    ("3=10mbit", "expects hN=RATE"), ("h3", "expects hN=RATE"), ("h0=10mbit", "expects hN=RATE"),
    ("h3=", "expects hN=RATE"), ("h3=fast", "expected a rate like 100mbit"), ("h3=0.1bit", "from 1kbit"),
])
def test_bad_slow_link_specs_are_refused_in_one_line(text, words):
    with pytest.raises(UsageError) as exc:
        parse_slow_links(text)
    assert words in str(exc.value) and "\n" not in str(exc.value)


def links_spec(**changes):
    """An hvdps emulate cluster description of 3 hosts, h2 on a link of its own (--link h2=10mbit)."""
    desc = {"counters": "/proc/1/net/dev", "ports": {"10.9.0.1": "h1", "10.9.0.2": "h2", "10.9.0.3": "h3"},
            "rate": "100mbit", "rate_bps": 1e8, "rates": {"10.9.0.1": 1e8, "10.9.0.2": 1e7, "10.9.0.3": 1e8},
            "namespaces": {"10.9.0.1": "hvdps-7-h1", "10.9.0.2": "hvdps-7-h2", "10.9.0.3": "hvdps-7-h3"},
            "switch": "hvdps-7-sw", "queue_ms": 200}
    desc.update(changes)
    return LinksSpec(**{k: v for k, v in desc.items() if v is not None})


@pytest.mark.parametrize("link, spec, want", [
    (SlowLink("h3", "1mbit"), links_spec(), ("hvdps-7-h3", "hvdps-7-sw", 200, "10.9.0.3", 1e8)),
    (SlowLink("h2", "1mbit"), links_spec(), ("hvdps-7-h2", "hvdps-7-sw", 200, "10.9.0.2", 1e7)),   # back to its own
    (SlowLink("h4", "1mbit"), links_spec(), "the cluster has no host h4 (it has h1, h2, h3)"),
    (SlowLink("h3", "1mbit"), None, "run the comparison under hvdps emulate"),
    (SlowLink("h3", "1mbit"), links_spec(switch=None), "run the comparison under hvdps emulate"),
])
def test_a_slow_link_is_found_in_the_clusters_description(link, spec, want):
    if isinstance(want, str):
        with pytest.raises(UsageError, match=re.escape(want)):
            cond.link_of(link, spec)
    else:
        assert cond.link_of(link, spec) == want


@pytest.mark.parametrize("fields, ok", [
    ({"rank": 1, "factor": 4}, True),
    ({"link": "h3", "host": "10.9.0.3", "rate": "10mbit", "rate_bps": 1e7}, True),
    ({}, False),                                                       # whose?
    ({"rank": 1, "host": "10.9.0.3", "rate_bps": 1e7}, False),         # a worker's and a host's
    ({"link": "h3", "rate_bps": 1e7}, False),                          # a link without its host
])
def test_a_record_names_a_worker_or_a_link(fields, ok):
    make = lambda: Unhealthy(condition="c", what="w", **fields)        # noqa: E731
    if ok:
        make()
    else:
        with pytest.raises(ValueError):
            make()


@pytest.mark.parametrize("factor, cores, tasks, want", [
    (4, 2, 2, (2_500, 10_000)),       # two workers on two cores: a core each, a quarter of one
    (4, 2, 3, (1_667, 10_000)),       # two workers and a PS: two thirds of a core each
    (2, 8, 2, (5_000, 10_000)),       # more cores than tasks: still one core's worth at most
    (1000, 1, 4, (1_000, 4_000_000)),  # never below the kernel's 1 ms: a longer period instead
])
def test_quota_is_a_share_of_an_even_split(factor, cores, tasks, want):
    assert quota_us(factor, cores, tasks) == want


@pytest.mark.parametrize("environ, argv, want", [
    ({"TF_CONFIG": json.dumps({"cluster": {}, "task": {"type": "worker", "index": 3}})}, [], ("worker", 3)),
    ({"TF_CONFIG": "{not json"}, [], None),
    ({}, ["python", "-m", "ps_train.main", "--job_name=worker", "--task_index=1"], ("worker", 1)),
    ({}, ["python", "-m", "ps_train.main", "--job_name", "ps", "--task_index", "0"], ("ps", 0)),
    ({}, ["python", "-m", "mwms_train.main", "--task_index=2"], ("worker", 2)),
    ({}, ["sh", "-c", "python -m ps_train.main --job_name=worker --task_index=1"], None),
    ({}, ["python", "-m", "ps_train.launch", "--num_workers", "2"], None),
])
def test_a_tensorflow_task_is_known_by_its_tf_config_or_flags(environ, argv, want):
    assert task_of(environ, argv) == want


@pytest.mark.parametrize("launcher, environ, argv, want", [
    (MPIRunLauncher(), {"OMPI_COMM_WORLD_RANK": "1"}, ["python", "mpi_train/main.py"], 1),
    (MPIRunLauncher(), {"HOROVOD_RANK": "0"}, ["python", "horovod_train/main.py"], 0),
    (MPIRunLauncher(), {}, ["mpirun", "-np", "2"], None),
    (TaskLauncher(), {}, ["python", "-m", "ps_train.main", "--job_name=worker", "--task_index=1"], 1),
    (TaskLauncher(), {}, ["python", "-m", "ps_train.main", "--job_name=ps", "--task_index=0"], None),
    (TaskLauncher(), {}, ["python", "-m", "ps_train.main", "--job_name=chief", "--task_index=0"], None),
])
def test_each_launcher_names_its_workers(launcher, environ, argv, want):
    assert launcher.worker_of(environ, argv) == want


def test_the_process_tree_and_identity_are_read_from_proc():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "--task_index=5"],
                             env={**os.environ, "OMPI_COMM_WORLD_RANK": "7"})
    try:
        assert child.pid in unhealthy.descendants(os.getpid())
        environ, argv = unhealthy.process_identity(child.pid)
        assert environ["OMPI_COMM_WORLD_RANK"] == "7" and argv[-1] == "--task_index=5"
    finally:
        child.kill()
        child.wait()
    assert unhealthy.process_identity(child.pid) is None


@pytest.mark.parametrize("layout, want", [
    ({"cpu,cpuacct": "cpu.cfs_quota_us"}, ("cpu,cpuacct", 1)),          # systemd's co-mounted v1 hierarchy
    ({"unified": "cgroup.controllers"}, ("unified", 2)),                 # cgroup2 offering cpu
    ({"cpuacct": "cpu.cfs_quota_us"}, None),                             # not the cpu controller
    ({}, None),
])
def test_the_cpu_controller_is_found_where_the_mounts_say(tmp_path, layout, want):
    """v1's cpu hierarchy wherever /proc/mounts has it, else a cgroup2 with cpu; else one usage error.
    Never mounted here: this test runs in the machine's own mount namespace."""
    lines = []
    for name, marker in layout.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / marker).write_text("cpu io memory\n" if marker == "cgroup.controllers" else "-1\n")
        kind = "cgroup2" if marker == "cgroup.controllers" else "cgroup"
        lines.append(f"cgroup {tmp_path / name} {kind} rw,relatime{',' + name if kind == 'cgroup' else ''} 0 0")
    (tmp_path / "mounts").write_text("\n".join(lines) + "\n")
    find = lambda: CpuController.find(v1=str(tmp_path / "none"), mounts=str(tmp_path / "mounts"),
                                      private=str(tmp_path / "private"))
    if want is None:
        with pytest.raises(UsageError, match="--straggler needs the kernel's CPU controller writable"):
            find()
        assert not (tmp_path / "private").exists()
    else:
        c = find()
        assert (c.root, c.version) == (str(tmp_path / want[0]), want[1]) and not c.mounted


def _groups():
    return sorted(n for n in os.listdir(V1) if n.startswith(cgroups.GROUP_PREFIX))


_living, _stopped = living, stopped


@pytest.mark.root
def test_a_group_limits_a_process_and_a_stale_one_is_removed():
    """A real CPU group: a spinning child held to a tenth of a core uses about that; removed with
    it still running (it goes back to the root group); a group named after a dead comparison is
    removed at the next start."""
    c = CpuController.find(V1)
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    group = c.create(f"{cgroups.GROUP_PREFIX}{os.getpid()}-test", 1_000, 10_000)
    try:
        assert c.add(group, spin.pid) and c.members(group) == [spin.pid]
        ticks = lambda: sum(map(int, open(f"/proc/{spin.pid}/stat").read().rsplit(")", 1)[1].split()[11:13]))
        t0, c0 = time.monotonic(), ticks()
        time.sleep(1.5)
        used = (ticks() - c0) / os.sysconf("SC_CLK_TCK") / (time.monotonic() - t0)
        assert used < 0.2, used                     # a tenth of a core, and CFS's period granularity
    finally:
        assert c.remove(group)
        spin.kill()
        spin.wait()
    assert not os.path.exists(group)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    os.mkdir(os.path.join(V1, f"{cgroups.GROUP_PREFIX}{dead.pid}-left"))
    assert f"{cgroups.GROUP_PREFIX}{dead.pid}-left" in c.remove_stale()


COMPARE = ["--workers", "2", "--backends", "mpi,ps:async,ps:backup1", "--straggler", "1:4", "--train_steps", "300",
           "--no_progress"]


@pytest.mark.root
@pytest.mark.process
@pytest.mark.alone
def test_a_slow_worker_costs_the_ring_more_than_async_ps(tmp_path):
    """The issue's comparison at 2 workers with worker 1 at a quarter of its CPU: bare MPI keeps at
    most half its healthy throughput; asynchronous PS, and sync PS with
    one backup worker (which drops the late gradients), each keep more of theirs than bare MPI by
    0.25 at least (measured spreads: BENCHMARKS.md, an unhealthy cluster). Every unhealthy run
    records whom it slowed or stopped, every run has a timeline with both workers' tracks, and no
    group is left."""
    out = str(tmp_path / "cmp")
    before = _groups()
    r = run([os.path.join(BIN, "hvdps"), "compare", *COMPARE, "--out", out], timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = {(x["mode"], x["condition"]): x for x in json.load(open(os.path.join(out, "results.json")))["rows"]}
    keep = {m: rows[(m, "slow1x4")]["samples_per_sec_median"] / rows[(m, None)]["samples_per_sec_median"]
            for m in ("sync", "async", "backup1")}
    assert keep["sync"] <= 0.5, keep                        # bare MPI waits for its slow rank
    assert keep["async"] >= keep["sync"] + 0.25, keep       # async PS does not
    assert keep["backup1"] >= keep["sync"] + 0.25, keep     # nor does sync PS with a backup worker ...
    assert all(rows[("backup1", c)]["dropped_gradients"] > 0 for c in (None, "slow1x4"))   # ... which drops work
    for name in ("ps-backup1-w2-ps1", "ps-backup1-w2-ps1-slow1x4"):   # and still makes its 600 updates
        lines = [json.loads(line) for line in open(os.path.join(out, "runs", name, "metrics.jsonl"))]
        updates = [x["steps"] for x in lines if x.get("type") == "summary"]   # the release's last token: 601
        assert len(updates) == 1 and 600 <= updates[0] <= 601, (name, updates)
    for name in ("mpi-sync-w2-slow1x4", "ps-async-w2-ps1-slow1x4", "ps-backup1-w2-ps1-slow1x4"):
        applied = json.load(open(os.path.join(out, "runs", name, "compare_run.json")))["unhealthy"]
        assert len(applied["pids"]) == 1 and applied["quota_us"] > 0, (name, applied)
    for name in os.listdir(os.path.join(out, "runs")):       # every run: a track per worker in its timeline
        if os.path.isdir(os.path.join(out, "runs", name)):
            check_timeline(os.path.join(out, "runs", name), ["rank:0", "rank:1"] if name.startswith("mpi")
                           else ["worker:0", "worker:1"], idle=["worker:1"] if "async" in name else [])
    report = open(os.path.join(out, "report.md")).read()
    assert report.index("**An unhealthy cluster**, mlp, 2 worker(s), worker 1 at 1/4 CPU") < report.index("## Runs")
    assert "## An unhealthy cluster" in report and "![straggler.png](straggler.png)" in report
    assert "![ranks.png](ranks.png)" in report and "step p50 / p95 by rank (ms)" in report
    for png in ("straggler.png", "ranks.png"):
        assert os.path.getsize(os.path.join(out, png)) > 10_000
    assert [g for g in _groups() if g not in before] == []


@pytest.mark.root
@pytest.mark.process
@pytest.mark.parametrize("flag, spec, name", [("--straggler", "1:8", "mpi-sync-w2-slow1x8"),
                                              ("--stall", "1:400:200", "mpi-sync-w2-stall1-400-200")])
def test_a_killed_comparison_leaves_no_group_and_no_process(tmp_path, flag, spec, name):
    """SIGTERM while worker 1 is held in its group, or stopped by the stall: the comparison ends its
    job, and no group of its own and no process of the job is left, stopped or running; the stalled
    run still records what was done to it."""
    out = str(tmp_path / "cmp")
    p = subprocess.Popen([os.path.join(BIN, "hvdps"), "compare", "--workers", "2", "--backends", "mpi", flag, spec,
                          "--train_steps", "200", "--no_progress", "--out", out],
                         cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    group = os.path.join(V1, f"{cgroups.GROUP_PREFIX}{p.pid}-{name}")
    held, job, deadline = [], [], time.monotonic() + 240
    try:
        while time.monotonic() < deadline and p.poll() is None:      # the unhealthy run, its worker caught
            tree = [pid for pid in unhealthy.descendants(p.pid) if pid != p.pid]
            held = CpuController(V1, 1).members(group) if flag == "--straggler" else _stopped(tree)
            if held:
                job = tree
                break
            time.sleep(0.02)
        assert held and set(held) <= set(job), (held, job)
        os.kill(p.pid, signal.SIGTERM)
        text = p.communicate(timeout=120)[0].decode()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 128 + signal.SIGTERM, text[-2000:]
    assert f"error: SIGTERM: stopped {name}" in text, text[-2000:]
    assert not os.path.exists(group)
    deadline = time.monotonic() + 10       # SIGKILLed as the comparison ended: gone once the kernel has them
    while time.monotonic() < deadline and _living(job):
        time.sleep(0.05)
    assert not _living(job), "the job's processes outlived it"
    applied = json.load(open(os.path.join(out, "runs", name, "compare_run.json")))["unhealthy"]
    assert applied["pids"] and (applied["quota_us"] if flag == "--straggler" else applied["stops"]) >= 1


@pytest.mark.root
def test_a_stalled_worker_is_continued_whatever_ends_the_run():
    """The stall stops and continues worker 1 (found by its launcher rank below this process) on its
    period; when the run ends by an exception, the worker is running, not stopped."""
    rank = lambda r: subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                      env={**os.environ, "OMPI_COMM_WORLD_RANK": str(r)})
    ranks = [rank(0), rank(1)]
    stopped = []
    try:
        with pytest.raises(RuntimeError):
            with unhealthy.Injector(Stall(1, 300, 150), os.getpid(), MPIRunLauncher().worker_of, 2, 2, "t") as inj:
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and not stopped:
                    stopped = _stopped([p.pid for p in ranks])
                    time.sleep(0.01)
                raise RuntimeError("the run failed")
        assert stopped == [ranks[1].pid]
        assert inj.applied.pids == [ranks[1].pid] and inj.applied.stops >= 1
        # each stop, in Unix time, as the projection's held-out check reads it (compare_run.json)
        windows = inj.applied.stopped_at
        assert len(windows) == inj.applied.stops and all(0 <= b - a <= 1.0 for a, b in windows), windows
        assert Unhealthy(**inj.applied.to_dict()).stopped_at == windows
        assert _stopped([p.pid for p in ranks]) == []
    finally:
        for p in ranks:
            p.kill()
            p.wait()


def _row(mode, rate, factor=None, tta=1.0, backend="ps", ranks=None):
    """A comparison's row as hvdps/measure/runs.py makes it: healthy, or worker 1 slowed by ``factor``."""
    applied = None if factor is None else Unhealthy(condition=f"slow1x{factor:g}", what=f"worker 1 at 1/{factor:g} CPU",
                                                    rank=1, factor=factor, quota_us=2500, period_us=10000,
                                                    controller="cgroup v1", pids=[7])
    return RunRow(run_dir=f"runs/{backend}-{mode}" + (f"-slow1x{factor:g}" if factor else ""), status="ok",
                  model="mlp", backend=backend, mode=mode, workers=2, samples_per_sec_median=rate,
                  time_to_target=tta, condition=applied and applied.condition, unhealthy=applied,
                  rank_steps=ranks)


CURVE = [_row("sync", 40_000, backend="mpi"), _row("sync", 14_000, 2, 2.0, "mpi"), _row("sync", 6_000, 4, 4.0, "mpi"),
         _row("async", 12_000), _row("async", 11_000, 2), _row("async", 10_000, 4, 1.2),
         _row("backup1", 5_000), _row("backup1", 4_900, 2), _row("backup1", 4_800, 4)]


def test_where_a_method_that_does_not_wait_overtakes_one_that_does():
    """Judged by throughput at each slowdown factor, against the methods that wait for every worker."""
    assert unhealthy_report.overtakes(CURVE) == [
        "PS async overtakes bare MPI at F = 4 (mlp, 2 workers): 10,000 against 6,000 samples/s, where healthy it ran "
        "at 0.30x of bare MPI's",
        "PS sync, 1 backup stays behind bare MPI up to F = 4 (mlp, 2 workers)"]
    assert unhealthy_report.overtakes(CURVE[:2]) == []               # one method: nothing to overtake


def test_the_verdict_opens_with_what_each_method_keeps_and_the_section_lays_it_beside_the_model(tmp_path):
    steps = {"worker:0": StepQuantiles(n=10, p50=0.002, p95=0.003, max=0.004),
             "worker:1": StepQuantiles(n=10, p50=0.02, p95=0.03, max=0.04)}
    rows = CURVE + [dataclasses.replace(CURVE[5], run_dir="runs/x", rank_steps=steps)]
    lines = unhealthy_report.verdicts(rows)
    assert lines[0].startswith("- **An unhealthy cluster**, mlp, 2 worker(s), worker 1 at 1/2 CPU: ")
    assert "PS async keeps 0.92x of its healthy throughput and takes 1.00x as long to the target" in lines[0]
    assert "bare MPI keeps 0.35x of its healthy throughput and takes 2.00x as long" in lines[0]
    assert lines[-1].startswith("- **With one worker slowed by F**: PS async overtakes bare MPI at F = 4")
    table = "\n".join(unhealthy_report.section(rows))
    assert "| mlp | bare MPI | 2 | worker 1 at 1/4 CPU | 6,000 | 0.15x | 0.25x | 4 | 4.00x | - | cgroup v1: 2,500 of 10,000" \
        in table
    assert "| PS sync, 1 backup | 2 | worker 1 at 1/4 CPU | 4,800 | 0.96x | 0.62x |" in table     # summed rates
    assert "| PS async | 2 | worker 1 at 1/4 CPU | 10,000 | 0.83x | 0.62x |" in table
    assert "worker:0 2.00 / 3.00, worker:1 20.00 / 30.00" in table
    assert unhealthy_report.section(CURVE[:1]) == []
    assert unhealthy_report.write_straggler_plot(rows, str(tmp_path)) == "straggler.png"
    assert unhealthy_report.write_ranks_plot(rows, str(tmp_path)) is None     # no healthy run with its ranks
