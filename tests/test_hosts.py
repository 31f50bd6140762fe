import json

import pytest

from common.base.errors import UsageError
from common.launch.hosts import parse_host_list, parse_hostfile, parse_hostfile_text, to_mpi_hostfile
from tf_cluster.spec import parse_cluster_spec, parse_tf_config, role_counts, to_cluster_spec, tf_configs


@pytest.mark.parametrize("text, hosts", [
    ("a slots=2\nb slots=4\n", [("a", 2), ("b", 4)]),
    ("# comment\n\n  a   slots=1  # trailing\n", [("a", 1)]),
    ("node-01.example\n", [("node-01.example", 1)]),
    ("a slots=2 max_slots=4\n", [("a", 2)]),
])
def test_hostfile_good(text, hosts):
    assert parse_hostfile_text(text) == hosts


@pytest.mark.parametrize("text, message", [
    ("a slots=0\n", "hf:1: slots must be a positive integer, got '0'"),
    ("a\nb slots=x\n", "hf:2: slots must be a positive integer"),
    ("a slots=2\n\nb cpus=3\n", "hf:3: unknown option 'cpus=3'"),
    ("a\na\n", "hf:2: host a listed twice"),
    ("# nothing\n\n", "hf: no hosts listed"),
    ("bad_host! slots=1\n", "hf:1: invalid host name"),
    ("a slots\n", "hf:1: unknown option 'slots'"),
])
def test_hostfile_bad(text, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        parse_hostfile_text(text, "hf")


def test_hostfile_missing(tmp_path):
    with pytest.raises(UsageError, match="cannot read hostfile"):
        parse_hostfile(str(tmp_path / "nope"))


def test_host_list():
    assert parse_host_list("a:2,b:1,c") == [("a", 2), ("b", 1), ("c", 1)]
    with pytest.raises(UsageError, match="slots for a must be a positive integer"):
        parse_host_list("a:0")


def test_cluster_spec_json_and_yaml(tmp_path):
    c = {"ps": ["p:1"], "worker": ["w:1", "w:2"]}
    (tmp_path / "c.json").write_text(json.dumps({"cluster": c}))
    (tmp_path / "c.yaml").write_text("ps: [p:1]\nworker:\n  - w:1\n  - w:2\n")
    assert parse_cluster_spec(str(tmp_path / "c.json")) == c
    assert parse_cluster_spec(str(tmp_path / "c.yaml")) == c


@pytest.mark.parametrize("cluster, message", [
    ({"ps": ["p:1"], "boss": ["b:1"]}, "unknown role 'boss'"),
    ({"worker": ["w:1"]}, "no 'ps' tasks"),
    ({"ps": ["p:1"], "worker": []}, "needs a non-empty list"),
    ({"ps": ["p:99999"], "worker": ["w:1"]}, "port must be 1-65535"),
    ({"ps": ["p"], "worker": ["w:1"]}, "expected host:port"),
    ({"ps": ["p:1"], "worker": ["p:1"]}, "also used by ps"),
    ({"ps": ["p:1"], "worker": ["w:1"], "chief": ["c:1", "c:2"]}, "at most one chief"),
])
def test_cluster_spec_bad(tmp_path, cluster, message):
    f = tmp_path / "c.json"
    f.write_text(json.dumps(cluster))
    with pytest.raises(UsageError, match=message):
        parse_cluster_spec(str(f))


@pytest.mark.parametrize("text, message", [
    ("{not json", "TF_CONFIG: not valid JSON"),
    ('{"cluster": {"ps": ["p:1"], "worker": ["w:1"]}}', "must have 'cluster' and 'task'"),
    ('{"cluster": {"ps": ["p:1"], "worker": ["w:1"]}, "task": {"type": "chief", "index": 0}}',
     "task type 'chief' is not in the cluster"),
    ('{"cluster": {"ps": ["p:1"], "worker": ["w:1"]}, "task": {"type": "worker", "index": 3}}',
     r"task index 3 out of range for worker \(0..0\)"),
])
def test_tf_config_bad(text, message):
    with pytest.raises(UsageError, match=message):
        parse_tf_config(text)


@pytest.mark.parametrize("text, roles, cluster", [
    ("ps=1,chief=1", (("ps", 1), ("chief", 1)), {"ps": ["a:2222"], "chief": ["a:2223"], "worker": ["b:2222", "b:2223"]}),
    ("ps=2", (("ps", 2),), {"ps": ["a:2222", "a:2223"], "worker": ["b:2222", "b:2223"]}),   # worker 0 is chief
    ("chief=1", (("chief", 1),), {"chief": ["a:2222"], "worker": ["a:2223", "b:2222", "b:2223"]}),
])
def test_a_cluster_holds_the_tasks_asked_on_the_first_slots(text, roles, cluster):
    assert role_counts(text) == roles
    assert to_cluster_spec([("a", 2), ("b", 2)], roles, port=2222) == cluster


@pytest.mark.parametrize("text, message", [
    ("ps=3,chief=1", "4 slots cannot hold 3 ps, 1 chief and at least one worker"),
    ("ps=1,ps=2", "expected ps=N once"),
    ("ps", "expected ps=N once"),
    ("gpu=1", "expected ROLE=N with ROLE one of chief, ps, evaluator"),
])
def test_a_cluster_that_cannot_be_is_refused(text, message):
    with pytest.raises(UsageError, match=message):
        to_cluster_spec([("a", 2), ("b", 2)], role_counts(text))


def test_inventory_conversions():
    hosts = [("a", 2), ("b", 2)]
    assert to_mpi_hostfile(hosts) == "a slots=2\nb slots=2\n"
    cluster = to_cluster_spec(hosts, (("ps", 1), ("chief", 1)), port=2222)
    assert cluster == {"ps": ["a:2222"], "chief": ["a:2223"], "worker": ["b:2222", "b:2223"]}
    configs = tf_configs(cluster)
    assert len(configs) == 4
    for role, i, text in configs:
        assert parse_tf_config(text) == (cluster, role, i)
