"""TF_CONFIG from a JobSet pod's own variables: what every TensorFlow method's pod reads on Kubernetes.

JobSet (jobset.x-k8s.io/v1alpha2) runs each replicated job as an Indexed Job, names each pod's host
``<jobset>-<replicatedJob>-<jobIndex>-<podIndex>`` under the headless service ``spec.network.subdomain``,
and labels the pods with their JobSet and replicated job; Kubernetes gives every pod of an Indexed
Job its index in ``JOB_COMPLETION_INDEX``. hvdps' manifests (hvdps/commands/k8s.py) name each
replicated job after its TensorFlow role (``ps``, ``worker``, ``chief``), hand the labels to the
container through the Downward API and state the task counts, so a pod derives its TF_CONFIG
itself: nothing in the manifest lists addresses, and no operator injects anything.

The variables (``ENV``) come from the manifest; a pod that has some but not all of them, or a bad
one, is refused in one line.
"""
import json

from common.base.errors import UsageError
from common.base.numbers import whole

INDEX = "JOB_COMPLETION_INDEX"        # Kubernetes, in every pod of an Indexed Job
JOBSET = "HVDPS_JOBSET"               # labels['jobset.sigs.k8s.io/jobset-name']
REPLICATED_JOB = "HVDPS_REPLICATED_JOB"   # labels['jobset.sigs.k8s.io/replicatedjob-name']
JOB_INDEX = "HVDPS_JOB_INDEX"         # labels['jobset.sigs.k8s.io/job-index']
TASKS = "HVDPS_TF_TASKS"              # the roles and counts: "ps:1,worker:2"
SUBDOMAIN = "HVDPS_SUBDOMAIN"         # spec.network.subdomain (JobSet's default: the JobSet's name)
PORT = "HVDPS_TF_PORT"                # the port every task listens on
ENV = (INDEX, JOBSET, REPLICATED_JOB, JOB_INDEX, TASKS, SUBDOMAIN, PORT)
LABELS = {JOBSET: "jobset.sigs.k8s.io/jobset-name", REPLICATED_JOB: "jobset.sigs.k8s.io/replicatedjob-name",
          JOB_INDEX: "jobset.sigs.k8s.io/job-index"}
ROLES = ("chief", "ps", "worker")
MAX_TASKS = 1 << 16
DNS_LABEL = 63                        # a host name's label: RFC 1123


def parse_tasks(text, source=TASKS):
    """``ps:1,worker:2`` -> {role: count}, TensorFlow's roles in TF_CONFIG's order."""
    out = {}
    for part in str(text).split(","):
        role, sep, count = part.strip().partition(":")
        n = whole(count.strip())
        if not sep or role not in ROLES or n is None:
            raise UsageError(f"{source}: expected ROLE:COUNT[,ROLE:COUNT...] with roles {', '.join(ROLES)}, got {text!r}")
        if not 1 <= n <= MAX_TASKS or role in out:
            raise UsageError(f"{source}: {role} listed twice or with a count outside 1..{MAX_TASKS}, in {text!r}")
        out[role] = n
    if out.get("chief", 0) > 1:
        raise UsageError(f"{source}: at most one chief, got {out['chief']}")
    return {role: out[role] for role in ROLES if role in out}


def host_of(jobset, role, index, job_index=0):
    """A pod's host name as JobSet gives it."""
    return f"{jobset}-{role}-{job_index}-{index}"


def cluster_of(jobset, subdomain, tasks, port):
    """{role: [fqdn:port]} of every task of a JobSet whose replicated jobs are its TensorFlow roles,
    each one Job of ``tasks[role]`` pods."""
    return {role: [f"{host_of(jobset, role, i)}.{subdomain}:{port}" for i in range(n)] for role, n in tasks.items()}


def _whole(environ, name, low, high):
    n = whole(str(environ.get(name, "")).strip())
    if n is None or not low <= n <= high:
        raise UsageError(f"{name}={environ.get(name, '')!r}: expected a whole number in {low}..{high}")
    return n


def pod_tf_config(environ):
    """The pod's TF_CONFIG (a JSON string) from the variables ``ENV`` names; None where none of hvdps'
    are set (not a JobSet pod of hvdps')."""
    if not any(environ.get(name) for name in (JOBSET, REPLICATED_JOB, TASKS, SUBDOMAIN)):
        return None
    missing = [name for name in ENV if name != PORT and not str(environ.get(name, "")).strip()]
    if missing:
        raise UsageError(f"a JobSet pod's TF_CONFIG needs {', '.join(missing)}: not set (the manifest gives "
                         f"them; {INDEX} comes from an Indexed Job)")
    jobset, role, subdomain = (str(environ[n]).strip() for n in (JOBSET, REPLICATED_JOB, SUBDOMAIN))
    tasks = parse_tasks(environ[TASKS])
    if role not in tasks:
        raise UsageError(f"{REPLICATED_JOB}={role!r}: not one of {TASKS}'s roles ({', '.join(tasks)})")
    if _whole(environ, JOB_INDEX, 0, MAX_TASKS) != 0:
        raise UsageError(f"{JOB_INDEX}={environ[JOB_INDEX]}: each TensorFlow role is one Job (replicas: 1) "
                         f"whose pods are its tasks")
    index = _whole(environ, INDEX, 0, tasks[role] - 1)
    port = _whole(environ, PORT, 1, 65535) if str(environ.get(PORT, "")).strip() else 2222
    for name, value in ((JOBSET, jobset), (SUBDOMAIN, subdomain)):
        if not value.replace("-", "").isalnum() or value != value.lower() or value.startswith("-") \
                or value.endswith("-") or len(value) > DNS_LABEL:
            raise UsageError(f"{name}={value!r}: not a DNS label (lower-case letters, digits and '-', "
                             f"at most {DNS_LABEL})")
    longest = host_of(jobset, max(tasks, key=len), max(tasks.values()) - 1)
    if len(longest) > DNS_LABEL:
        raise UsageError(f"{JOBSET}={jobset!r}: its pods' host names ({longest}) pass {DNS_LABEL} characters")
    return json.dumps({"cluster": cluster_of(jobset, subdomain, tasks, port), "task": {"type": role, "index": index}})
