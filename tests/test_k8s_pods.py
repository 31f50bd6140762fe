"""hvdps k8s's manifests run here: a root test plays the kubelet (tests/kubelet.py) for the JobSets of
classic sync PS, TF2's PS and MultiWorkerMirroredStrategy and for an MPIJob of bare MPI, each pod a
network namespace named as the pod, running the container's own command with the manifest's own
environment. Each pod derives its TF_CONFIG from its JobSet's variables (tf_cluster/jobset.py), and
the jobs train to the suite's target; hvdps compare --from then reads the results volume."""
import json
import os
import shutil
import subprocess

import pytest
import yaml

from hvdps.commands import k8s
from hvdps.measure.rows import load_run
from tests.conftest import BIN, REPO, env
from tests.kubelet import jobset_pods, run_jobset, run_mpijob

pytestmark = pytest.mark.root

FLAGS = ["--epochs", "4", "--batch_size", "32", "--log_every", "5"]
JOBSETS = ("ps-sync-w2-ps1", "ps2-async-w2-ps1", "mwms-sync-w2")


def need_root():
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"):
        pytest.skip("playing the kubelet needs root, ip and unshare")


def test_the_pods_own_commands_train_and_compare_reads_the_volume(tmp_path):
    need_root()
    results, out = tmp_path / "results", tmp_path / "k8s"
    assert k8s.main(["--backends", "ps:sync,ps2,mwms,mpi", "--workers", "2", "--image", "hvdps:dev",
                     "--results_path", str(results), "--out", str(out), *FLAGS]) == 0
    for name in JOBSETS:
        doc = yaml.safe_load(open(out / f"{name}.yaml"))
        codes, pods = run_jobset(doc, str(tmp_path))
        assert codes == [0] * len(pods), [(p.name, c) for p, c in zip(pods, codes)]
        row = load_run(str(results / name))
        assert row.status == "ok" and row.workers == 2 and row.final_test_accuracy >= 0.9, (name, row)
        # the PS jobs record their cluster: every task by the name JobSet gives its pod, from the
        # TF_CONFIG each pod built itself
        cluster = getattr(row.header, "cluster", None)
        if name.startswith("ps"):
            assert {a.rsplit(":", 1)[0] for addrs in cluster.values() for a in addrs} == {p.fqdn for p in pods}
    code, pods = run_mpijob(yaml.safe_load(open(out / "mpi-sync-w2.yaml")), str(tmp_path))
    launcher = pods[-1]
    assert code == 0, open(launcher.log).read()[-3000:]
    row = load_run(str(results / "mpi-sync-w2"))
    assert row.status == "ok" and row.workers == 2 and row.final_test_accuracy >= 0.9, row
    # the results volume, read as a SLURM allocation's is
    r = subprocess.run([os.path.join(BIN, "hvdps"), "compare", "--from", str(results), "--out", str(tmp_path / "report")],
                       capture_output=True, text=True, timeout=300, cwd=REPO, env=env())
    assert r.returncode == 0, r.stderr[-3000:]
    names = {os.path.basename(x["run_dir"]) for x in json.load(open(tmp_path / "report" / "results.json"))["rows"]}
    assert names == {*JOBSETS, "mpi-sync-w2"}


def test_a_pods_names_and_variables_are_the_manifests():
    doc = yaml.safe_load(open(os.path.join(REPO, "hostfiles", "k8s", "ps2-async-w2-ps1.yaml")))
    pods = jobset_pods(doc)
    assert [p.name for p in pods] == ["ps2-async-w2-ps1-ps-0-0", "ps2-async-w2-ps1-worker-0-0",
                                      "ps2-async-w2-ps1-worker-0-1", "ps2-async-w2-ps1-chief-0-0"]
    assert pods[2].fqdn == "ps2-async-w2-ps1-worker-0-1.ps2-async-w2-ps1"
    assert pods[2].env["JOB_COMPLETION_INDEX"] == "1" and pods[2].env["HVDPS_REPLICATED_JOB"] == "worker"
    assert pods[2].argv[:2] == ["python", "ps_train/main.py"]
