"""Scheduler scripts and hostfiles parse and use flags the trainers accept (manifests: test_manifests.py)."""
import glob
import json
import os
import re
import shlex
import subprocess

import pytest
import yaml

from common.launch.hosts import parse_hostfile
from tf_cluster.spec import parse_cluster_spec, parse_tf_config
from horovod_train.backend import add_horovod_args
from mwms_train.backend import add_mwms_args
from ps_train.main import make_parser as ps_parser
from common.spec.config import build_parser
from hvdps.commands.compare import make_parser as compare_make_parser
from tests.conftest import BIN, REPO, run

HF = os.path.join(REPO, "hostfiles")
SCRIPTS = sorted(glob.glob(os.path.join(HF, "slurm", "*")) + glob.glob(os.path.join(HF, "pbs", "*")))


def parse_trainer(script, args):
    parser = (add_horovod_args(build_parser("t")) if "horovod_train" in script else
              add_mwms_args(build_parser("t")) if "mwms_train" in script else ps_parser())
    return parser.parse_args(args)


@pytest.mark.parametrize("path", SCRIPTS, ids=os.path.basename)
def test_scripts_are_valid_bash(path):
    r = subprocess.run(["bash", "-n", path], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("path", SCRIPTS, ids=os.path.basename)
def test_script_trainer_flags_are_accepted(path):
    """Each trainer line, with the script's default HVDPS_TRAIN_ARGS and every PS_MODE, parses."""
    text = open(path).read()
    defaults = re.search(r'\$\{HVDPS_TRAIN_ARGS:-([^}]*)\}', text)
    assert defaults, "no HVDPS_TRAIN_ARGS default"
    modes = [m.strip("()").split() for m in re.findall(r"MODE=(\([^)]*\))", text)] or [[]]
    calls = re.findall(r"python ((?:horovod|ps|mwms)_train/main\.py)([^\n]*)", text)
    # a variable the script gives a default (VAR=${VAR:-value}) stands for that value, any other for "x"
    given = dict(re.findall(r"^(\w+)=\$\{\1:-([^}]*)\}", text, re.M))
    compare = re.findall(r"^hvdps compare ([^\n]*)", text, re.M)
    assert calls or compare, "no trainer or comparison call found"
    for rest in compare:          # the comparison with the script's default flags
        words = [w for w in shlex.split(rest) if w not in ("${COMPARE_ARGS[@]}", "${TRAIN_ARGS[@]}")]
        compare_args = re.search(r'\$\{HVDPS_COMPARE_ARGS:-([^}]*)\}', text).group(1).split()
        args = compare_make_parser().parse_args([*words, *compare_args, *defaults.group(1).split()])
        assert args.batch_size > 0 and args.hosts == "slurm"
    for script, rest in calls:
        for mode in modes:
            args = []
            for word in shlex.split(rest):
                if word == "${TRAIN_ARGS[@]}":
                    args += defaults.group(1).split()
                elif word == "${MODE[@]}":
                    args += mode
                elif word != "\\":
                    args.append(re.sub(r"\$\{[^}]+\}|\$(\w+)", lambda m: given.get(m.group(1) or "", "x"), word))
            assert parse_trainer(script, args).batch_size > 0


def test_scripts_share_one_shape():
    """Every script reserves the same tasks: 2 nodes x 2 tasks (hostfiles/README.md, "One shape")."""
    shapes = {}
    for path in SCRIPTS:
        text = open(path).read()
        if path.endswith(".sbatch"):
            nodes = re.search(r"^#SBATCH --nodes=(\d+)$", text, re.M)
            per_node = re.search(r"^#SBATCH --ntasks-per-node=(\d+)$", text, re.M)
        else:
            nodes, per_node = re.search(r"^#PBS -l nodes=(\d+):ppn=(\d+)", text, re.M), None
        assert nodes, path
        shapes[os.path.basename(path)] = (int(nodes.group(1)), int((per_node or nodes).group(2 if not per_node else 1)))
    assert set(shapes.values()) == {(2, 2)}, shapes


@pytest.mark.parametrize("manifest, need_ps", [("ps-sync-w2-ps1.yaml", True), ("ps2-async-w2-ps1.yaml", True),
                                              ("mwms-sync-w2.yaml", False)])
def test_jobset_pods_tf_config_is_accepted(manifest, need_ps):
    """What each pod of a shipped JobSet builds from its own variables parses as our TF_CONFIG: its own
    role and index, and every task by its pod's DNS name."""
    from tests.kubelet import jobset_pods
    from tf_cluster.jobset import pod_tf_config
    pods = jobset_pods(yaml.safe_load(open(os.path.join(HF, "k8s", manifest))))
    for pod in pods:
        cluster, role, index = parse_tf_config(pod_tf_config(pod.env), need_ps=need_ps)
        assert (role, index) == (pod.role, pod.index)
        assert sorted(a.rsplit(":", 1)[0] for addrs in cluster.values() for a in addrs) == sorted(p.fqdn for p in pods)


def test_example_files_parse():
    assert parse_hostfile(os.path.join(HF, "hostfile.example")) == [("node1", 4), ("node2", 4)]
    assert parse_cluster_spec(os.path.join(HF, "cluster.json"))["ps"] == ["node1:2222", "node2:2222"]
    assert parse_cluster_spec(os.path.join(HF, "cluster.yaml"))["chief"] == ["node1:2224"]


@pytest.mark.parametrize("procid,nodes,tasks,num_ps,chief,want", [
    # the scripts' shape, 2 nodes x 2 tasks: several tasks per node, a port each
    (0, "h[1-2]", "2(x2)", 1, False, ("ps", 0, {"ps": ["h1:2222"], "worker": ["h1:2223", "h2:2222", "h2:2223"]})),
    (3, "h[1-2]", "2(x2)", 1, False, ("worker", 2, None)),
    (1, "h[1-2]", "2(x2)", 2, False, ("ps", 1, {"ps": ["h1:2222", "h1:2223"], "worker": ["h2:2222", "h2:2223"]})),
    # v2: the chief first (the resolver deals roles out by name), then the PS, then the workers
    (0, "h[1-2]", "2(x2)", 1, True, ("chief", 0, {"chief": ["h1:2222"], "ps": ["h1:2223"],
                                                  "worker": ["h2:2222", "h2:2223"]})),
    (2, "node[01-03]", "1(x3)", 1, False, ("worker", 1, {"ps": ["node01:2222"], "worker": ["node02:2222", "node03:2222"]})),
])
def test_slurm_task_tf_config(procid, nodes, tasks, num_ps, chief, want):
    """ps.sbatch's roles: TensorFlow's SlurmClusterResolver, as ps_train/slurm.py drives it."""
    from ps_train.slurm import tf_config
    env = {"SLURM_PROCID": str(procid), "SLURM_STEP_NODELIST": nodes, "SLURM_STEP_TASKS_PER_NODE": tasks}
    config = json.loads(tf_config(num_ps, chief, 2222, env))
    role, index, cluster = want
    assert (config["task"]["type"], config["task"]["index"]) == (role, index)
    if cluster:
        assert config["cluster"] == cluster
    assert parse_tf_config(json.dumps(config))[1] == role


@pytest.mark.parametrize("procid,nodes,tasks,index,cluster", [
    (0, "h[1-2]", "2(x2)", 0, ["h1:2222", "h1:2223", "h2:2222", "h2:2223"]),
    (3, "h[1-2]", "2(x2)", 3, ["h1:2222", "h1:2223", "h2:2222", "h2:2223"]),
    (1, "node[01-03]", "1(x3)", 1, ["node01:2222", "node02:2222", "node03:2222"]),
])
def test_slurm_task_tf_config_for_all_reduce(procid, nodes, tasks, index, cluster):
    """mwms.sbatch: every task a worker, in SLURM's task order, which the trainer's cluster reader takes."""
    from tf_cluster.slurm import slurm_tf_config
    env = {"SLURM_PROCID": str(procid), "SLURM_STEP_NODELIST": nodes, "SLURM_STEP_TASKS_PER_NODE": tasks}
    config = json.loads(slurm_tf_config(lambda total: {"worker": total}, 2222, env))
    assert config == {"cluster": {"worker": cluster}, "task": {"type": "worker", "index": index}}
    assert parse_tf_config(json.dumps(config), need_ps=False)[2] == index


@pytest.mark.parametrize("env,num_ps,expect", [
    ({}, 1, "not inside a SLURM job step"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "h1", "SLURM_STEP_TASKS_PER_NODE": "1"}, 1, "at least one worker"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "h[9-10]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}, 1,
     "orders them by name"),
])
def test_slurm_task_tf_config_refusals(env, num_ps, expect):
    from common.base.errors import UsageError
    from ps_train.slurm import tf_config
    with pytest.raises(UsageError, match=expect):
        tf_config(num_ps, False, 2222, env)


@pytest.mark.parametrize("name", ["hostfile.example"])
def test_shipped_hostfile_accepted_by_horovodrun(name, tmp_path):
    """Horovod 0.28.1's own --hostfile parser (it has none of ours' tolerance) reads the file."""
    from horovod.runner.common.util.hosts import parse_host_files
    path = os.path.join(HF, name)
    assert parse_host_files(path) == ",".join(f"{h}:{s}" for h, s in parse_hostfile(path))
    # and what hvdps hosts writes for mpirun/horovodrun is accepted as well
    out = tmp_path / "hf"
    r = run([os.path.join(BIN, "hvdps"), "hosts", path, "--format", "mpi-hostfile"], timeout=60)
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
