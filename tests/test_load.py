"""The machine's other load while a run measured (hvdps/measure/load.py): the arithmetic on
recorded samples, a real process tree's ticks, and a comparison beside a CPU hog against the same
comparison alone (``alone``: make test runs it after the rest, with nothing else of the suite's
beside it)."""
import json
import os
import subprocess
import sys
import time

import pytest

from common.formats.schemas import LoadFile
from hvdps.measure.load import HZ, others_cores, tree_ticks
from tests.conftest import BIN, env, run


def load(*samples, cores=2):
    return LoadFile(hz=100, cores=cores, samples=[list(s) for s in samples])


@pytest.mark.unit
@pytest.mark.parametrize("samples, interval, want", [
    # 10 s: the machine busy 1.8 cores, the job 1.0, the comparison 0.05: the rest used 0.75
    ([(100, 0, 0, 0, 0), (110, 1800, 2000, 1000, 50)], (100, 110), (0.75, 1.0, None, None)),
    # the job alone on the machine: nothing left over for anyone else
    ([(100, 0, 0, 0, 0), (110, 1500, 2000, 1500, 0)], (100, 110), (0.0, 1.5, None, None)),
    # read between samples, linearly: the interval's half of each counter
    ([(100, 0, 0, 0, 0), (120, 3600, 4000, 2000, 0)], (105, 115), (0.8, 1.0, None, None)),
    # of the 0.75 left over, the hypervisor gave 0.4 to other tenants and the kernel's threads used 0.1
    ([(100, 0, 0, 0, 0, 0, 0), (110, 1800, 2000, 1000, 50, 400, 100)], (100, 110), (0.25, 1.0, 0.4, 0.1)),
    # a kernel thread that ended took its ticks out of the sum: its share is not below 0
    ([(100, 0, 0, 0, 0, 0, 500), (110, 1500, 2000, 1400, 0, 0, 300)], (100, 110), (0.1, 1.4, 0.0, 0.0)),
    # an interval past the last sample: not known
    ([(100, 0, 0, 0, 0), (110, 1800, 2000, 1000, 5)], (105, 111), None),
    # a failed run's tenth of a second, its processes exiting (the job's ticks falling): not measured
    ([(100, 0, 0, 0, 0), (100.5, 90, 100, 0, 0)], (100.2, 100.3), None),
])
def test_what_the_rest_of_the_machine_used(samples, interval, want):
    got = others_cores(load(*samples), interval)
    if want is None:
        assert got is None
    for g, w in zip(got or (), want or ()):
        assert g is None if w is None else g == pytest.approx(w), got


@pytest.mark.unit
@pytest.mark.parametrize("samples, says", [
    ([(100, 0, 0, 0, 0), (110, 1, 2, 1, 1, 0, 0)], "expected 7 values in every sample"),
    ([(100, 0, 0, 0, 0, 9, 0), (110, 1, 2, 1, 1, 8, 0)], "sample 1 has a counter below sample 0's"),
    ([(100, 0, 0, 0, 0, 0), (110, 1, 2, 1, 1, 0)], "expected 7 values in every sample"),
])
def test_a_load_file_is_read_whole_or_refused(samples, says):
    with pytest.raises(ValueError) as caught:
        load(*samples)
    assert says in str(caught.value)


@pytest.mark.process
def test_a_process_trees_ticks_count_its_busy_child():
    """A child spinning for about a second adds about a second of ticks to its parent's tree."""
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.Popen([sys.executable, "
                               "'-c', 'import time\\nend = time.time() + 30\\nwhile time.time() < end: pass']).wait()"])
    try:
        time.sleep(1.0)
        before, t0 = tree_ticks(parent.pid), time.monotonic()
        time.sleep(1.0)
        spun = (tree_ticks(parent.pid) - before) / HZ / (time.monotonic() - t0)
    finally:
        subprocess.run(["pkill", "-KILL", "-P", str(parent.pid)])
        parent.kill()
        parent.wait()
    assert 0.5 <= spun <= 1.1, spun


COMPARE = ["--backends", "horovod", "--workers", "2", "--train_steps", "1500", "--log_every", "100",
           "--warmup_steps", "200", "--probe_steps", "20", "--eval_every_epoch", "false",
           "--checkpoint_every_epoch", "false", "--no_progress"]


def _compare(out):
    r = run([os.path.join(BIN, "hvdps"), "compare", *COMPARE, "--out", out], timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (row,) = json.load(open(os.path.join(out, "results.json")))["rows"]
    return row, open(os.path.join(out, "report.md")).read()


@pytest.mark.process
@pytest.mark.alone
def test_a_cpu_hog_beside_a_comparison_marks_it_shared_and_alone_it_is_not(tmp_path):
    """With two processes spinning beside it, the run is marked shared (what the rest of the machine
    used: 0.45-0.7 of a core, measured here with one or two spinners beside the job's two busy ranks;
    at least 0.3, well over the 0.2 that makes a run shared on 2 cores), the verdict says so up
    front, and the projection's check against measured runs leaves it out, naming it. The same
    comparison with the machine to itself is not marked (under 0.2)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        shared, report = _compare(str(tmp_path / "hog"))
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert shared["shared"] is True and shared["others_cores"] >= 0.3, shared
    verdict = report.split("## Runs")[0]
    assert "**on a shared machine**, measuring the other work too: Horovod (the rest of the machine used" in verdict
    assert "| ok (shared: the rest of the machine used " in report          # the table's status
    r = run([os.path.join(BIN, "hvdps"), "project", "--from", str(tmp_path / "hog" / "runs"), "--bandwidth_gbps", "10",
             "--latency_us", "10", "--out", str(tmp_path / "proj")], timeout=120, env=env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    projection = json.load(open(tmp_path / "proj" / "projection.json"))
    assert projection["checked"] == [] and [x["run"] for x in projection["left_out"]] == ["horovod-sync-w2"]
    assert "Left out of this check, since they measured contention for the cores, not the method: " \
        "horovod-sync-w2 (shared: the rest of the machine used" in (tmp_path / "proj" / "projection.md").read_text()

    alone, report = _compare(str(tmp_path / "alone"))
    # no other process: the rest of the machine used under 0.2 of its cores. The kernel's own threads
    # are not counted against the run; the hypervisor's other tenants are (a virtual machine's steal),
    # and then the run is marked shared, naming them.
    assert alone["others_cores"] < 0.2 and alone["hypervisor_cores"] is not None, alone
    assert alone["shared"] is (alone["others_cores"] + alone["hypervisor_cores"] > 0.2), alone
    assert ("**on a shared machine**" in report.split("## Runs")[0]) is alone["shared"], report[:2000]


@pytest.mark.unit
@pytest.mark.parametrize("shared, others, hypervisor, oversubscribed, says, never", [
    (True, 0.93, 0.0, False, "2 worker(s), one run each; **on a shared machine**, measuring the other work too: "
     "Horovod (the rest of the machine used 0.93 of its 2 cores). No backend reaches", "oversubscribed"),
    (True, 0.02, 0.44, False, "**on a shared machine**, measuring the other work too: Horovod (the rest of the "
     "machine used 0.02 of its 2 cores and the hypervisor gave 0.44 to other tenants (steal)). ", "oversubscribed"),
    (False, 0.01, None, True, "2 worker(s), one run each; **oversubscribed** (more processes than cores): PS async. No backend reaches",
     "shared"),
    (None, None, None, False, "2 worker(s), one run each: ", "shared"),      # not sampled: nothing said either way
    (False, 0.01, 0.01, False, "2 worker(s), one run each: ", "shared"),
])
def test_the_verdict_names_what_its_runs_measured_besides_the_method(shared, others, hypervisor, oversubscribed, says,
                                                                     never):
    from hvdps.measure.rows import Load, RunRow
    from hvdps.render.report import verdicts
    rows = [RunRow(run_dir="runs/horovod-sync-w2", status="ok", model="mlp", backend="horovod", mode="sync",
                   workers=2, samples_per_sec_median=900.0,
                   load=Load(shared=shared, others_cores=others, hypervisor_cores=hypervisor, machine_cores=2)),
            RunRow(run_dir="runs/ps-async-w2", status="ok", model="mlp", backend="ps", mode="async", workers=2,
                   samples_per_sec_median=800.0, oversubscribed=oversubscribed)]
    (text,) = verdicts(rows)
    assert says in text and never not in text, text
