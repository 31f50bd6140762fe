"""Scheduler scripts and hostfiles parse and use flags the trainers accept (manifests: test_manifests.py)."""
import glob
import json
import os
import re
import shlex
import subprocess

import pytest
import yaml

from common.hosts import parse_cluster_spec, parse_hostfile, parse_tf_config
from horovod_train.backend import add_horovod_args
from ps_train.main import make_parser as ps_parser
from common.config import build_parser
from tests.conftest import BIN, REPO, run

HF = os.path.join(REPO, "hostfiles")
SCRIPTS = sorted(glob.glob(os.path.join(HF, "slurm", "*")) + glob.glob(os.path.join(HF, "pbs", "*")))


def parse_trainer(script, args):
    parser = add_horovod_args(build_parser("t")) if "horovod_train" in script else ps_parser()
    return parser.parse_args(args)


@pytest.mark.parametrize("path", SCRIPTS, ids=os.path.basename)
def test_scripts_are_valid_bash(path):
    r = subprocess.run(["bash", "-n", path], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("path", SCRIPTS, ids=os.path.basename)
def test_script_trainer_flags_are_accepted(path):
    text = open(path).read()
    train = re.search(r'TRAIN_ARGS=\(?"?([^)\n"]*(?:"[^"\n]*"[^)\n"]*)*)', text)
    calls = re.findall(r"python ((?:horovod|ps)_train/main\.py)([^\n]*)", text)
    assert calls, "no trainer call found"
    for script, rest in calls:
        args = shlex.split(rest.replace('"${TRAIN_ARGS[@]}"', "").replace("$TRAIN_ARGS", ""))
        if train and ("TRAIN_ARGS" in rest):
            args += shlex.split(re.sub(r"\$\{[^}]+\}", "x", train.group(1)))
        args = [re.sub(r"\$\{[^}]+\}|\$\w+", "x", a) for a in args if a != "\\"]
        cfg_args = parse_trainer(script, args)
        assert cfg_args.batch_size > 0


@pytest.mark.parametrize("manifest", ["tfjob.yaml", "tfjob_v2.yaml"])
def test_tfjob_tf_config_is_accepted(manifest):
    """What the operator would inject for this TFJob parses as our TF_CONFIG."""
    doc = yaml.safe_load(open(os.path.join(HF, "k8s", manifest)))
    reps = doc["spec"]["tfReplicaSpecs"]
    cluster = {role.lower(): [f"hvdps-ps-{role.lower()}-{i}:2222" for i in range(spec["replicas"])]
               for role, spec in reps.items()}
    for role in cluster:
        for i in range(len(cluster[role])):
            assert parse_tf_config(json.dumps({"cluster": cluster, "task": {"type": role, "index": i}}))[1] == role


def test_example_files_parse():
    assert parse_hostfile(os.path.join(HF, "hostfile.example")) == [("node1", 4), ("node2", 4)]
    assert parse_cluster_spec(os.path.join(HF, "cluster.json"))["ps"] == ["node1:2222", "node2:2222"]
    assert parse_cluster_spec(os.path.join(HF, "cluster.yaml"))["chief"] == ["node1:2224"]


def test_slurm_ps_script_builds_tf_config(tmp_path):
    """Run ps.sbatch with stand-ins for srun/scontrol/python: each task gets a valid, distinct TF_CONFIG."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "scontrol").write_text("#!/bin/bash\nprintf 'nodeA\\nnodeB\\nnodeC\\n'\n")
    (stubs / "srun").write_text("#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\n"
                                "for i in 0 1 2; do SLURM_PROCID=$i \"$@\" || exit 1; done\n")
    (stubs / "python").write_text("#!/bin/bash\necho \"$TF_CONFIG\"\n")
    for f in stubs.iterdir():
        f.chmod(0o755)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "activate").write_text(f"export PATH={stubs}:$PATH\n")
    env = dict(os.environ, SLURM_SUBMIT_DIR=str(tmp_path), SLURM_JOB_NODELIST="node[A-C]", SLURM_JOB_ID="7",
               PATH=f"{stubs}:{os.environ['PATH']}")
    r = subprocess.run(["bash", os.path.join(HF, "slurm", "ps.sbatch")], capture_output=True, text=True,
                       env=env, timeout=30)
    assert r.returncode == 0, r.stderr
    configs = [parse_tf_config(line) for line in r.stdout.strip().splitlines()]
    assert [(role, i) for _, role, i in configs] == [("ps", 0), ("worker", 0), ("worker", 1)]
    assert configs[0][0] == {"ps": ["nodeA:2222"], "worker": ["nodeB:2222", "nodeC:2222"]}


@pytest.mark.parametrize("name", ["hostfile.example"])
def test_shipped_hostfile_accepted_by_horovodrun(name, tmp_path):
    """Horovod 0.28.1's own --hostfile parser (it has none of ours' tolerance) reads the file."""
    from horovod.runner.common.util.hosts import parse_host_files
    path = os.path.join(HF, name)
    assert parse_host_files(path) == ",".join(f"{h}:{s}" for h, s in parse_hostfile(path))
    # and what hvdps-hosts writes for mpirun/horovodrun is accepted as well
    out = tmp_path / "hf"
    r = run([os.path.join(BIN, "hvdps-hosts"), path, "--format", "mpi-hostfile"], timeout=60)
    out.write_text(r.stdout)
    assert parse_host_files(str(out)) == parse_host_files(path)


def test_discovery_script_prints_what_horovod_parses(tmp_path):
    from horovod.runner.common.util.hosts import parse_hosts
    script = os.path.join(HF, "discover_hosts.sh")
    r = run([script], timeout=30)
    assert r.returncode == 0 and [h.hostname for h in parse_hosts(",".join(r.stdout.split()))] == ["localhost"]
    (tmp_path / "h").write_text("node1:4\nnode2:2\n")
    r = run([script], env=dict(os.environ, HVDPS_HOSTS_FILE=str(tmp_path / "h")), timeout=30)
    assert [(h.hostname, h.slots) for h in parse_hosts(",".join(r.stdout.split()))] == [("node1", 4), ("node2", 2)]
