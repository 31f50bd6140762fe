"""The shipped SLURM scripts and hvdps compare, run by a real SLURM on the emulated hosts.

hvdps emulate --slurm starts Debian's slurm-wlm 22.05 (munged and slurmctld on the login node,
``slurmd -N hK`` in each host's namespace), submits each script with sbatch, then runs the
comparison inside an allocation of every host (``salloc``, ``--hosts slurm``). Each job's final
test accuracy is checked: sync PS's against the same training run locally, MWMS's against Horovod's
(the same big-batch SGD), every one against the target. Needs root and the packages
(``make setup`` installs them); skipped with the reason elsewhere.
"""
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import read_records
from common.base.procs import child_env
from hvdps.measure.slurm_lab import SLURM_TOOLS, shm_dir
from tests.conftest import REPO, run

pytestmark = pytest.mark.root

TRAIN = ["--model", "mlp", "--epochs", "3", "--batch_size", "32", "--seed", "7"]


@pytest.fixture(autouse=True)
def need_root_and_slurm():
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        pytest.skip("the emulated cluster needs root, ip and tc")
    missing = [t for t in SLURM_TOOLS if not shutil.which(t) and not os.path.exists(f"/usr/sbin/{t}")]
    if missing:
        pytest.skip(f"SLURM is not installed ({', '.join(missing)} missing: apt-get install slurmctld slurmd "
                    f"slurm-client munge)")


def final_accuracy(run_dir):
    evals = [r for r in read_records(os.path.join(run_dir, "metrics.jsonl")) if r.get("type") == "eval" and r.get("split") == "test"]
    assert evals, f"no evaluation in {run_dir}"
    return evals[-1]["accuracy"]


def leftovers(pid):
    names = [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
             if n.startswith(f"hvdps-{pid}-")]
    daemons = subprocess.run(["pgrep", "-f", f"/run/hvdps-emulate/{pid}-slurm"], capture_output=True,
                             text=True).stdout.split()
    files = [p for p in (f"/run/hvdps-emulate/{pid}-slurm", f"/run/hvdps-emulate/{pid}.json", shm_dir(pid))
             if os.path.exists(p)] + [f"/etc/netns/{n}" for n in names if os.path.exists(f"/etc/netns/{n}")]
    return names, daemons, files


def test_sbatch_each_script_and_compare_inside_an_allocation(tmp_path):
    local = tmp_path / "local"
    # The same training on this machine: sync PS's roles on the script's shape, 2 nodes x 2 tasks (1 PS +
    # 3 workers: its updates are the same wherever its tasks run). Horovod's 4 ranks and MWMS's 4 workers
    # are both one process at 4x the batch (test_horovod.py, test_mwms.py): held to each other below.
    # TF2's PS is asynchronous: a run elsewhere is another draw, and its job is held to the accuracy.
    r = run([sys.executable, "-m", "ps_train.launch", "--num_ps", "1", "--num_workers", "3", "--sync", *TRAIN,
             "--train_dir", str(local / "sync")], timeout=300)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])

    out = tmp_path / "emu"
    p = subprocess.Popen(
        [sys.executable, "-m", "hvdps.commands.emulate", "--slurm", "--hosts", "3", "--rate", "1gbit", "--out", str(out),
         "--sbatch", "hostfiles/slurm/horovod.sbatch", "--sbatch", "PS_MODE=sync hostfiles/slurm/ps.sbatch",
         "--sbatch", "PS_MODE=v2 hostfiles/slurm/ps.sbatch", "--sbatch", "hostfiles/slurm/mwms.sbatch",
         # the comparison as a batch job: it runs on the first node, itself one of the hosts
         "--sbatch", "HVDPS_COMPARE_ARGS='--backends horovod --workers 4' hostfiles/slurm/compare.sbatch", "--",
         "--workers", "2", "--backends", "horovod,mwms,ps:sync", *TRAIN, "--eval_every_epoch", "false",
         "--checkpoint_every_epoch", "false", "--no-progress", "--run_timeout", "240"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
        env=child_env(HVDPS_TRAIN_ARGS=" ".join(TRAIN)))
    try:
        text = p.communicate(timeout=900)[0]
    except subprocess.TimeoutExpired:
        p.kill()
        text = p.communicate()[0]
        pytest.fail("hvdps emulate --slurm did not end within 900 s\n" + text[-4000:])
    assert p.returncode == 0, text[-4000:]
    assert "emulated cluster removed" in text
    assert leftovers(p.pid) == ([], [], [])

    jobs = json.load(open(out / "sbatch" / "jobs.json"))
    assert [(j["script"], j["variables"].get("PS_MODE"), j["state"], j["exit"]) for j in jobs] == [
        ("hostfiles/slurm/horovod.sbatch", None, "COMPLETED", 0),
        ("hostfiles/slurm/ps.sbatch", "sync", "COMPLETED", 0),
        ("hostfiles/slurm/ps.sbatch", "v2", "COMPLETED", 0),
        ("hostfiles/slurm/mwms.sbatch", None, "COMPLETED", 0),
        ("hostfiles/slurm/compare.sbatch", None, "COMPLETED", 0)], jobs
    batch = json.load(open(os.path.join(jobs[-1]["run_dir"], "results.json")))
    batch = batch["rows"] if isinstance(batch, dict) else batch
    assert [(r["backend"], r["workers"], r["status"]) for r in batch] == [("horovod", 4, "ok")], batch
    record = json.load(open(next(p for p in glob.glob(os.path.join(jobs[-1]["run_dir"], "runs", "horovod-*",
                                                                   "compare_run.json")))))
    assert len(set(record["roles"].values())) == 2, record          # the ranks ran on both nodes
    got = {}
    for job, ref in zip(jobs, ("horovod", "sync", "v2", "mwms")):
        header = next(r for r in read_records(os.path.join(job["run_dir"], "metrics.jsonl")) if r["type"] == "header")
        # the scripts' shape, 2 nodes x 2 tasks: 4 ranks; PS: one task is a PS (and v2's chief does not train)
        assert header["world_size"] == {"horovod": 4, "sync": 3, "v2": 2, "mwms": 4}[ref], (ref, header)
        got[ref] = final_accuracy(job["run_dir"])
        assert got[ref] >= 0.85, (ref, got[ref])
    for ref, want, tolerance in (("sync", final_accuracy(local / "sync"), 0.02),
                                 ("mwms", got["horovod"], 0.02)):      # Horovod and MWMS: the same big-batch SGD
        assert abs(got[ref] - want) <= tolerance, (ref, got[ref], want)

    # the comparison ran inside the allocation: its hosts are SLURM's node names, its runs succeeded
    results = json.load(open(out / "results.json"))
    rows = results["rows"] if isinstance(results, dict) else results
    assert sorted((r["backend"], r["status"]) for r in rows) == [("horovod", "ok"), ("mwms", "ok"), ("ps", "ok")], rows
    report = open(out / "report.md").read()
    assert "| h1 | rank:0 |" in report and "| h1 | ps:0 |" in report, report[-3000:]
