"""Kubernetes manifests: valid for the operator versions they target, and able to run.

Two layers. The schemas in hostfiles/k8s/schemas/ (MPIJob kubeflow.org/v2beta1 of mpi-operator
v0.5.0, TFJob kubeflow.org/v1 of training-operator v1.8.1, Kubernetes 1.29 core/v1 pods and claims,
closed as kubectl's strict field validation is) catch a wrong or misspelt field. The rules below catch
what a schema cannot: a job that is accepted but would not run or would lose its results.
Each rule is shown failing on a broken copy of a shipped manifest (table-driven).
"""
import copy
import glob
import json
import os
import re

import jsonschema
import pytest
import referencing
import yaml

from common.spec.config import build_parser
from common.base.errors import UsageError
from horovod_train.backend import add_horovod_args
from mwms_train.backend import add_mwms_args
from ps_train.main import make_parser as ps_parser
from tests.conftest import REPO

pytestmark = pytest.mark.unit

K8S = os.path.join(REPO, "hostfiles", "k8s")
SCHEMAS = os.path.join(K8S, "schemas")
MANIFESTS = sorted(glob.glob(os.path.join(K8S, "*.yaml")))
SCHEMA_OF = {("kubeflow.org/v2beta1", "MPIJob"): "mpijob-v2beta1.schema.json",
             ("kubeflow.org/v1", "TFJob"): "tfjob-v1.schema.json",
             ("v1", "Pod"): "core-v1.schema.json#/$defs/Pod",
             ("v1", "PersistentVolumeClaim"): "core-v1.schema.json#/$defs/PersistentVolumeClaim"}
BASE = "https://hvdps.example/k8s/"


def registry():
    resources = []
    for path in glob.glob(os.path.join(SCHEMAS, "*.schema.json")):
        schema = json.load(open(path))
        schema["$id"] = BASE + os.path.basename(path)
        resources.append((schema["$id"], referencing.Resource.from_contents(schema)))
    return referencing.Registry().with_resources(resources)


REGISTRY = registry()


def schema_errors(doc):
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key not in SCHEMA_OF:
        return [f"no schema for apiVersion {key[0]} kind {key[1]}"]
    validator = jsonschema.Draft202012Validator({"$ref": BASE + SCHEMA_OF[key]}, registry=REGISTRY)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def containers(doc):
    """(role, pod spec, container) of every container in a job or pod."""
    if doc["kind"] == "Pod":
        return [("Pod", doc["spec"], c) for c in doc["spec"]["containers"]]
    specs = doc["spec"].get("tfReplicaSpecs") or doc["spec"].get("mpiReplicaSpecs") or {}
    return [(role, s["template"]["spec"], c) for role, s in specs.items() for c in s["template"]["spec"]["containers"]]


def trainer_args(cmd):
    for i, a in enumerate(cmd):
        if re.search(r"(horovod|ps|mpi|mwms)_train/main\.py$", a):
            return a, cmd[i + 1:]
    return None, None


def claim_names():
    return {d["metadata"]["name"] for p in MANIFESTS for d in yaml.safe_load_all(open(p))
            if d["kind"] == "PersistentVolumeClaim"}


def rule_errors(doc):
    """What the schema cannot say: the job would run, and its results would outlive it."""
    errors = []
    for role, pod, c in containers(doc):
        image = c.get("image", "")
        first = image.split("/")[0]
        if "/" not in image or not ("." in first or ":" in first or first == "localhost"):
            errors.append(f"{role}: image {image!r} names no registry (the kubelet would pull it from Docker Hub)")
        if image.endswith(":latest") or ":" not in image.rsplit("/", 1)[-1]:
            errors.append(f"{role}: image {image!r} has no version tag")
        cmd = c.get("command", []) + c.get("args", [])
        if doc["kind"] == "MPIJob" and role == "Worker" and cmd[:2] != ["/usr/sbin/sshd", "-De"]:
            errors.append(f"Worker: runs {cmd or 'the image default'}, not sshd -De: mpirun could not reach it")
        if doc["kind"] == "MPIJob" and role == "Launcher" and (not cmd or cmd[0] != "mpirun"):
            errors.append(f"Launcher: runs {cmd}, not mpirun")
        script, args = trainer_args(cmd)
        if script is None:
            continue
        parser = (add_horovod_args(build_parser("t")) if "horovod_train" in script else
                  add_mwms_args(build_parser("t")) if "mwms_train" in script else ps_parser())
        try:
            train_dir = parser.parse_args(args).train_dir
        except (SystemExit, UsageError):
            errors.append(f"{role}: {script} does not accept {args}")
            continue
        if doc["kind"] == "MPIJob":          # rank 0 runs on a worker pod: that is where the run is written
            writer = [p for r, p, _ in containers(doc) if r == "Worker"]
        elif doc["kind"] == "TFJob":
            writer = [p for r, p, _ in containers(doc) if r in ("Chief", "Master")] or \
                     [p for r, p, _ in containers(doc) if r == "Worker"]
        else:
            writer = [pod]
        for wpod in writer[:1]:
            claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in wpod.get("volumes", [])
                      if "persistentVolumeClaim" in v}
            mounted = [m for wc in wpod["containers"] for m in wc.get("volumeMounts", [])
                       if m["name"] in claims and claims[m["name"]] in claim_names()
                       and os.path.commonpath([m["mountPath"], train_dir]) == m["mountPath"]]
            if not mounted:
                errors.append(f"{role}: --train_dir {train_dir} is not on a persistent volume claim the "
                              f"writer mounts: the results would end with the pod")
    if doc["kind"] == "TFJob":
        for role, _, c in containers(doc):
            ports = [p for p in c.get("ports", []) if p.get("name") == "tfjob-port"]
            if c["name"] == "tensorflow" and (not ports or ports[0]["containerPort"] != 2222):
                errors.append(f"{role}: no tfjob-port 2222 (the port TF_CONFIG names)")
    return errors


def docs_of(path):
    return list(yaml.safe_load_all(open(path)))


@pytest.mark.parametrize("path", MANIFESTS, ids=os.path.basename)
def test_shipped_manifest_is_valid_and_would_run(path):
    for doc in docs_of(path):
        assert schema_errors(doc) == []
        assert rule_errors(doc) == []


def test_every_kind_is_shipped():
    kinds = {d["kind"] for p in MANIFESTS for d in docs_of(p)}
    assert kinds == {"MPIJob", "TFJob", "Pod", "PersistentVolumeClaim"}


def test_one_image_everywhere_and_the_dockerfile_names_it():
    images = {c["image"] for p in MANIFESTS for d in docs_of(p) for _, _, c in containers(d)}
    assert len(images) == 1
    dockerfile = open(os.path.join(K8S, "Dockerfile")).read()
    assert f"-t {images.pop()} ." in dockerfile


def test_image_runs_sshd_and_keeps_host_state_out():
    dockerfile = open(os.path.join(K8S, "Dockerfile")).read()
    assert "openssh-server" in dockerfile and "mkdir -p /run/sshd" in dockerfile and "ssh-keygen -A" in dockerfile
    ignored = [l.strip() for l in open(os.path.join(REPO, ".dockerignore")) if l.strip() and not l.startswith("#")]
    for path in (".venv/", "runs/", "*.egg-info/", "common/native/*.so"):
        assert path in ignored


def _set(doc, path, value):
    *parents, last = path
    node = doc
    for p in parents:
        node = node[p]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value


MPI_WORKER = ["spec", "mpiReplicaSpecs", "Worker", "template", "spec"]
MPI_LAUNCHER = ["spec", "mpiReplicaSpecs", "Launcher", "template", "spec"]
TF_CHIEF = ["spec", "tfReplicaSpecs", "Chief", "template", "spec"]
TF_WORKER = ["spec", "tfReplicaSpecs", "Worker", "template", "spec"]


@pytest.mark.parametrize("manifest,path,value,layer,expect", [
    ("mpijob.yaml", MPI_WORKER + ["containers", 0, "command"], KeyError, "rule", "not sshd -De"),
    ("mpijob.yaml", MPI_WORKER + ["containers", 0, "command"], ["sleep", "infinity"], "rule", "not sshd -De"),
    ("mpijob.yaml", MPI_WORKER + ["containers", 0, "image"], "hvdps:latest", "rule", "names no registry"),
    ("mpijob.yaml", MPI_WORKER + ["containers", 0, "image"], "registry.example.com/hvdps/hvdps", "rule",
     "no version tag"),
    ("mpijob.yaml", MPI_WORKER + ["volumes", 0], {"name": "results", "emptyDir": {}}, "rule",
     "not on a persistent volume claim"),
    ("mpijob.yaml", MPI_LAUNCHER + ["containers", 0, "command", -1], "/tmp/x", "rule",
     "not on a persistent volume claim"),
    ("mpijob.yaml", MPI_LAUNCHER + ["containers", 0, "command", 15], "--no_such_flag", "rule",
     "does not accept"),
    ("mpijob.yaml", MPI_WORKER + ["containers", 0, "comand"], ["x"], "schema", "'comand' was unexpected"),
    ("mpijob.yaml", ["spec", "mpiReplicaSpecs", "Launcher", "replicas"], 2, "schema", "1 was expected"),
    ("mpijob.yaml", ["spec", "mpiReplicaSpecs", "Workers"], {}, "schema", "'Workers' was unexpected"),
    ("mpijob.yaml", ["spec", "runPolicy", "cleanPodPolicy"], "Always", "schema", "is not one of"),
    ("mpijob.yaml", ["spec", "slotsPerWorker"], "1", "schema", "is not of type 'integer'"),
    ("mpijob.yaml", ["apiVersion"], "kubeflow.org/v1", "schema", "no schema"),
    ("tfjob.yaml", ["spec", "tfReplicaSpecs", "PS", "template", "spec", "containers", 0, "name"], "tf", "schema",
     "does not contain"),
    ("tfjob.yaml", ["spec", "tfReplicaSpecs", "Ps"], {}, "schema", "'Ps' was unexpected"),
    ("tfjob.yaml", ["spec", "tfReplicaSpecs", "Worker", "restartPolicy"], "Sometimes", "schema", "is not one of"),
    ("tfjob.yaml", TF_CHIEF + ["containers", 0, "volumeMounts"], KeyError, "rule", "not on a persistent volume"),
    ("tfjob.yaml", TF_CHIEF + ["containers", 0, "ports", 0, "containerPort"], 2223, "rule", "tfjob-port 2222"),
    ("tfjob.yaml", TF_CHIEF + ["containers", 0, "ports", 0, "containerPort"], "2222", "schema",
     "is not of type 'integer'"),
    ("tfjob_v2.yaml", TF_CHIEF + ["containers", 0, "command", 9], "v3", "rule", "does not accept"),
    ("tfjob_mwms.yaml", TF_WORKER + ["containers", 0, "command", 9], "gloo", "rule", "does not accept"),
    ("tfjob_mwms.yaml", TF_WORKER + ["containers", 0, "command", -1], "/tmp/x", "rule",
     "not on a persistent volume claim"),
    ("tfjob_v2.yaml", TF_CHIEF + ["volumes", 0, "persistentVolumeClaim", "claimName"], "other", "rule",
     "not on a persistent volume claim"),
    ("results-pvc.yaml", ["spec", "accessModes"], ["ReadWriteAll"], "schema", "is not one of"),
    ("results-reader.yaml", ["spec", "containers", 0, "volumeMounts", 0, "mountPath"], "results", "schema",
     "does not match"),
])
def test_broken_manifest_is_caught(manifest, path, value, layer, expect):
    doc = copy.deepcopy(docs_of(os.path.join(K8S, manifest))[0])
    _set(doc, path, value)
    errors = schema_errors(doc) if layer == "schema" else rule_errors(doc)
    assert any(expect in e for e in errors), errors
