"""The kubelet's part, played for hvdps' own manifests on this machine (root): each pod a network
namespace named as the pod, with the pod's host name (a UTS namespace of its own) and an /etc/hosts
that resolves every pod of the job by its DNS name (``ip netns exec`` mounts /etc/netns/<pod>/hosts
over /etc/hosts), running the container's own command, args and environment from the manifest: the
Downward API's labels as JobSet sets them, ``JOB_COMPLETION_INDEX`` as an Indexed Job does, the
hostfile and variables mpi-operator gives an MPIJob's launcher. The image is this repository
(its ``workingDir``), its interpreter the venv's.

What it does not play: the API server, admission webhooks, the controllers' scheduling and restarts,
sshd (the launcher's mpirun enters the worker pods with the emulated cluster's agent,
hvdps/measure/netns_agent.sh, in place of ssh) and the volume (the manifests are written with
``--results_path`` on this machine).
"""
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from hvdps.measure.cluster import _free_subnet, remove_namespaces, sh
from hvdps.measure.slurm_lab import NETNS_ETC, remove_netns_etc
from common.base.procs import child_env
from tests.conftest import REPO

AGENT = os.path.join(REPO, "hvdps", "measure", "netns_agent.sh")
NAMESPACE = "default"


@dataclass
class Pod:
    name: str                  # the pod's host name, and its network namespace's
    fqdn: str
    argv: list
    env: dict
    role: str = ""
    index: int = 0
    port: int = 0
    ip: str = ""
    proc: object = None
    log: str = ""
    extra: dict = field(default_factory=dict)


def _value(item, labels):
    if "value" in item:
        return str(item["value"])
    path = item["valueFrom"]["fieldRef"]["fieldPath"]
    key = path[len("metadata.labels['"):-2]
    return labels[key]


def jobset_pods(doc):
    """The pods JobSet and the Job controller make of a JobSet: per replicated job (in order), one
    Indexed Job whose pods are ``<jobset>-<job>-0-<i>`` under the subdomain."""
    name, sub = doc["metadata"]["name"], doc["spec"]["network"]["subdomain"]
    pods = []
    for job in doc["spec"]["replicatedJobs"]:
        spec = job["template"]["spec"]
        c = spec["template"]["spec"]["containers"][0]
        for i in range(spec["completions"]):
            labels = {"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": job["name"],
                      "jobset.sigs.k8s.io/job-index": "0"}
            own = {e["name"]: _value(e, labels) for e in c.get("env", [])}
            own["JOB_COMPLETION_INDEX"] = str(i)
            host = f"{name}-{job['name']}-0-{i}"
            pods.append(Pod(host, f"{host}.{sub}", c["command"] + c.get("args", []), own, job["name"], i,
                            c["readinessProbe"]["tcpSocket"]["port"] if "readinessProbe" in c else 0))
    return pods


def mpijob_pods(doc, hostfile):
    """The launcher and worker pods mpi-operator makes of an MPIJob: workers ``<job>-worker-<i>``
    under the job's service, listed in the launcher's hostfile with their slots, and the variables
    the operator gives an Open MPI launcher (pkg/controller/mpi_job_controller.go: ompiEnvVars)."""
    name = doc["metadata"]["name"]
    spec = doc["spec"]["mpiReplicaSpecs"]
    slots = doc["spec"].get("slotsPerWorker", 1)
    workers = []
    for i in range(spec["Worker"]["replicas"]):
        host = f"{name}-worker-{i}"
        workers.append(Pod(host, f"{host}.{name}.{NAMESPACE}.svc", [], {}, "Worker", i))
    with open(hostfile, "w") as f:
        f.writelines(f"{w.fqdn} slots={slots}\n" for w in workers)
    c = spec["Launcher"]["template"]["spec"]["containers"][0]
    own = {e["name"]: _value(e, {}) for e in c.get("env", [])}
    own.update({"OMPI_MCA_orte_keep_fqdn_hostnames": "true", "OMPI_MCA_orte_default_hostfile": hostfile,
                "OMPI_MCA_plm_rsh_agent": AGENT})
    launcher = Pod(f"{name}-launcher", f"{name}-launcher.{name}.{NAMESPACE}.svc", c["command"] + c.get("args", []),
                   own, "Launcher")
    return [*workers, launcher]


class Kubelet:
    """The pods of one job on one bridge; ``down`` removes every namespace, process and file."""

    def __init__(self, pods, logs):
        self.pods, self.logs = pods, logs
        self.switch = f"k8s-{os.getpid()}-sw"

    def up(self):
        subnet = _free_subnet()
        sh("ip", "netns", "add", self.switch)
        sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i, pod in enumerate(self.pods):
            pod.ip = f"{subnet}.{i + 1}"
            sh("ip", "netns", "add", pod.name)
            sh("ip", "link", "add", "eth0", "netns", pod.name, "type", "veth", "peer", "name", f"p{i}",
               "netns", self.switch)
            sh("ip", "-n", self.switch, "link", "set", f"p{i}", "master", "br0", "up")
            sh("ip", "-n", pod.name, "addr", "add", f"{pod.ip}/24", "dev", "eth0")
            sh("ip", "-n", pod.name, "link", "set", "eth0", "up")
            sh("ip", "-n", pod.name, "link", "set", "lo", "up")
        hosts = "127.0.0.1 localhost\n" + "".join(f"{p.ip} {p.fqdn} {p.name}\n" for p in self.pods)
        for pod in self.pods:
            os.makedirs(os.path.join(NETNS_ETC, pod.name), exist_ok=True)
            with open(os.path.join(NETNS_ETC, pod.name, "hosts"), "w") as f:
                f.write(hosts)
        return self

    def netns_map(self):
        """HVDPS_NETNS_MAP for the agent: every pod's DNS name and short name to its namespace."""
        return ",".join(f"{n}={p.name}" for p in self.pods for n in (p.fqdn, p.name))

    def start(self, pod):
        """The container's process in the pod: its host name, the image's folder and PATH, its env."""
        pod.log = os.path.join(self.logs, f"{pod.name}.log")
        image = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root")}
        own = child_env(image, **pod.env, HVDPS_NETNS_MAP=self.netns_map())   # the venv first, as the image
        argv = ["ip", "netns", "exec", pod.name, "unshare", "--uts", "/bin/sh", "-c",
                'hostname "$0" && exec "$@"', pod.name, *pod.argv]
        with open(pod.log, "w") as log:
            pod.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        cwd=REPO, env=own, start_new_session=True)
        return pod

    def ready(self, pod, timeout):
        """Bounded wait for the pod's readiness probe: its port takes a TCP connection on its address."""
        deadline = time.monotonic() + timeout
        probe = f"import socket; socket.create_connection(('{pod.ip}', {pod.port}), 1).close()"
        while time.monotonic() < deadline:
            if pod.proc.poll() is not None:
                raise AssertionError(f"{pod.name} exited {pod.proc.returncode} before it was Ready:\n{self.tail(pod)}")
            r = subprocess.run(["ip", "netns", "exec", pod.name, sys.executable, "-c", probe], capture_output=True,
                               timeout=10)
            if r.returncode == 0:
                return
            time.sleep(0.5)
        raise AssertionError(f"{pod.name} not Ready within {timeout} s:\n{self.tail(pod)}")

    def wait(self, pods, timeout):
        """Bounded wait for these pods to end; their exit codes."""
        deadline = time.monotonic() + timeout
        for pod in pods:
            try:
                pod.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{pod.name} still running after {timeout} s:\n{self.tail(pod)}")
        return [p.proc.returncode for p in pods]

    def tail(self, pod, lines=30):
        try:
            return "".join(open(pod.log).readlines()[-lines:])
        except OSError:
            return ""

    def down(self):
        for pod in self.pods:
            if pod.proc is not None and pod.proc.poll() is None:
                try:
                    os.killpg(pod.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                pod.proc.wait(timeout=10)
        names = [p.name for p in self.pods]
        remove_namespaces([*names, self.switch])
        remove_netns_etc(names)
        left = set(names + [self.switch]) & set(sh("ip", "netns", "list").split())
        return sorted(left)


def run_jobset(doc, logs, timeout=300):
    """Every pod of a JobSet, each replicated job once the one it depends on is Ready, until the
    pods of the successPolicy's job end; (exit codes of every pod, the pods)."""
    pods = jobset_pods(doc)
    kubelet = Kubelet(pods, logs).up()
    try:
        order = [j["name"] for j in doc["spec"]["replicatedJobs"]]
        for role in order:
            for pod in [p for p in pods if p.role == role]:
                kubelet.start(pod)
            for pod in [p for p in pods if p.role == role and p.port]:
                kubelet.ready(pod, 120)
        ends = [p for p in pods if p.role in doc["spec"]["successPolicy"]["targetReplicatedJobs"]]
        kubelet.wait(ends, timeout)
        kubelet.wait(pods, 60)             # the PS tasks are released by the job's end
        return [p.proc.returncode for p in pods], pods
    finally:
        left = kubelet.down()
        assert not left, left


def run_mpijob(doc, logs, timeout=300):
    """The MPIJob's launcher command in its pod, against the worker pods; (its exit code, the pods)."""
    pods = mpijob_pods(doc, os.path.join(logs, f"{doc['metadata']['name']}.hostfile"))
    kubelet = Kubelet(pods, logs).up()
    try:
        launcher = kubelet.start(pods[-1])
        kubelet.wait([launcher], timeout)
        return launcher.proc.returncode, pods
    finally:
        left = kubelet.down()
        assert not left, left


def resolves(pod, name):
    """The address ``name`` has inside the pod's namespace (its /etc/hosts)."""
    r = subprocess.run(["ip", "netns", "exec", pod, sys.executable, "-c",
                        f"import socket; print(socket.gethostbyname('{name}'))"], capture_output=True, text=True,
                       timeout=10)
    return r.stdout.strip()

