"""tf_cluster/jobset.py: a JobSet pod's TF_CONFIG from its own variables, for every role and index,
and one line for each bad or missing variable."""
import json

import pytest

from common.base.errors import UsageError
from tf_cluster import jobset as js
from tf_cluster.spec import task_of, tf_config_of

pytestmark = pytest.mark.unit


def pod(role, index, tasks="ps:2,worker:2,chief:1", **over):
    env = {js.INDEX: None if index is None else str(index), js.JOBSET: "ps-sync-w2-ps2", js.REPLICATED_JOB: role, js.JOB_INDEX: "0",
           js.TASKS: tasks, js.SUBDOMAIN: "ps-sync-w2-ps2", js.PORT: "2222"}
    env.update(over)
    return {k: v for k, v in env.items() if v is not None}


CLUSTER = {"chief": ["ps-sync-w2-ps2-chief-0-0.ps-sync-w2-ps2:2222"],
           "ps": [f"ps-sync-w2-ps2-ps-0-{i}.ps-sync-w2-ps2:2222" for i in range(2)],
           "worker": [f"ps-sync-w2-ps2-worker-0-{i}.ps-sync-w2-ps2:2222" for i in range(2)]}


@pytest.mark.parametrize("role, index", [("chief", 0), ("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1)])
def test_every_role_and_index(role, index):
    got = json.loads(js.pod_tf_config(pod(role, index)))
    assert got == {"cluster": CLUSTER, "task": {"type": role, "index": index}}
    assert task_of(pod(role, index), []) == (role, index)       # what a slow worker is found by


def test_mwms_workers_only_and_another_port_and_subdomain():
    got = json.loads(js.pod_tf_config(pod("worker", 2, tasks="worker:3", **{js.PORT: "5000", js.SUBDOMAIN: "net"})))
    assert got["cluster"] == {"worker": [f"ps-sync-w2-ps2-worker-0-{i}.net:5000" for i in range(3)]}
    assert got["task"] == {"type": "worker", "index": 2}


def test_not_a_jobset_pod_and_an_own_tf_config_wins():
    assert js.pod_tf_config({"PATH": "/bin"}) is None
    assert tf_config_of({}) == ""
    own = json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}})
    assert tf_config_of({**pod("worker", 1), "TF_CONFIG": own}) == own
    assert json.loads(tf_config_of(pod("worker", 1)))["task"]["index"] == 1
    assert json.loads(tf_config_of({k: v for k, v in pod("ps", 0).items() if k != js.PORT}))["cluster"]["ps"][0].endswith(":2222")


@pytest.mark.parametrize("env, message", [
    (pod("worker", None), "needs JOB_COMPLETION_INDEX: not set"),
    (pod("worker", 0, **{js.SUBDOMAIN: None, js.JOB_INDEX: None}), "needs HVDPS_JOB_INDEX, HVDPS_SUBDOMAIN: not set"),
    (pod("worker", 2), "JOB_COMPLETION_INDEX='2': expected a whole number in 0..1"),
    (pod("worker", -1), "JOB_COMPLETION_INDEX='-1': expected a whole number in 0..1"),
    (pod("worker", "x"), "JOB_COMPLETION_INDEX='x'"),
    (pod("evaluator", 0), "HVDPS_REPLICATED_JOB='evaluator': not one of HVDPS_TF_TASKS's roles (chief, ps, worker)"),
    (pod("worker", 0, tasks="ps:2,worker:two"), "HVDPS_TF_TASKS: expected ROLE:COUNT"),
    (pod("worker", 0, tasks="ps:2,gpu:1"), "HVDPS_TF_TASKS: expected ROLE:COUNT"),
    (pod("worker", 0, tasks="ps:0,worker:1"), "count outside 1..65536"),
    (pod("worker", 0, tasks="worker:1,worker:2"), "worker listed twice"),
    (pod("chief", 0, tasks="chief:2,worker:1"), "at most one chief"),
    (pod("worker", 0, **{js.JOB_INDEX: "1"}), "each TensorFlow role is one Job (replicas: 1)"),
    (pod("worker", 0, **{js.PORT: "70000"}), "HVDPS_TF_PORT='70000': expected a whole number in 1..65535"),
    (pod("worker", 0, **{js.JOBSET: "Bad_Name"}), "HVDPS_JOBSET='Bad_Name': not a DNS label"),
    (pod("worker", 0, **{js.SUBDOMAIN: "-x"}), "HVDPS_SUBDOMAIN='-x': not a DNS label"),
    (pod("worker", 0, **{js.JOBSET: "a" * 60}), "its pods' host names"),
])
def test_bad_or_missing_variables_are_one_line(env, message):
    with pytest.raises(UsageError) as info:
        js.pod_tf_config(env)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert task_of(env, []) is None                              # not a worker the injector could name
