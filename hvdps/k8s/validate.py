"""Manifests checked by the ecosystem's own validators, strictly, against a stated Kubernetes version.

- Core kinds (a claim, a pod) go through ``kubernetes-validate`` (PyPI: Kubernetes' published
  OpenAPI schemas, one set per version) with ``strict``: an unknown field is an error, as
  ``kubectl apply --validate=strict`` makes it.
- JobSet and MPIJob go through the ``openAPIV3Schema`` of their released CRDs (hostfiles/k8s/crds/:
  JobSet v0.12.0, mpi-operator v0.8.2; data, with their licence noted there) with ``jsonschema``,
  closed the same way: an object schema that lists its properties and does not keep unknown fields
  (``x-kubernetes-preserve-unknown-fields``) refuses others, as the API server's strict field
  validation does. The pod and Job templates inside them go through ``kubernetes-validate`` too,
  as the core kinds they are (a ``batch/v1`` Job per replicated job, a ``v1`` PodTemplate per MPI
  replica).

What this cannot check: admission webhooks (JobSet's and the operator's defaulting and validation
webhooks), and what the controllers then do.
"""
import copy
import functools
import os

import jsonschema
import kubernetes_validate

from common.base.procs import REPO
from common.formats.schemas import read_crd_schema

KUBERNETES = "1.33.0"                  # the version the core schemas are taken at
CRDS = os.path.join(REPO, "hostfiles", "k8s", "crds")
CRD_FILES = {("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset.x-k8s.io_jobsets.v1alpha2.json",
             ("kubeflow.org/v2beta1", "MPIJob"): "kubeflow.org_mpijobs.v2beta1.json"}


def _closed(schema):
    """The schema with every object that lists its properties closed to others (strict fields)."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out and \
            not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@functools.lru_cache(maxsize=None)
def crd_validator(api_version, kind):
    schema = _closed(read_crd_schema(os.path.join(CRDS, CRD_FILES[(api_version, kind)])).openAPIV3Schema)
    # the API server fills these in; the CRD's schema leaves them open
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


def versions():
    """The Kubernetes versions kubernetes-validate holds schemas for ("1.25.0", ...)."""
    return kubernetes_validate.utils.all_versions()


def _core(doc, version):
    """Errors of one core-kind document by kubernetes-validate, strict."""
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = "/".join(str(p) for p in exc.path)
        return [f"{doc.get('kind')}{(' ' + path) if path else ''}: {exc.message}"]
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as exc:
        return [f"{doc.get('apiVersion')} {doc.get('kind')}: {exc}"]
    return []


def _templates(doc):
    """The core-kind documents inside a custom one: a Job per replicated job, a PodTemplate per replica."""
    name = doc["metadata"].get("name", "x")
    if doc["kind"] == "JobSet":
        return [{"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{name}-{j.get('name')}"},
                 "spec": copy.deepcopy(j.get("template", {}).get("spec", {}))}
                for j in doc.get("spec", {}).get("replicatedJobs", [])]
    if doc["kind"] == "MPIJob":
        return [{"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"{name}-{role.lower()}"},
                 "template": copy.deepcopy(spec.get("template", {}))}
                for role, spec in doc.get("spec", {}).get("mpiReplicaSpecs", {}).items()]
    return []


def errors(doc, version=KUBERNETES):
    """Every error the validators find in one manifest document ([] when it passes)."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key not in CRD_FILES:
        return _core(doc, version)
    found = [f"{doc['kind']} {'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
             for e in crd_validator(*key).iter_errors(doc)]
    for inner in _templates(doc):
        found += [f"{doc['kind']} {inner['metadata']['name']}: {e}" for e in _core(inner, version)]
    return found
