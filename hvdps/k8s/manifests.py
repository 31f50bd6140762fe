"""Kubernetes manifests for a comparison's runs: a JobSet (jobset.x-k8s.io/v1alpha2) for a method
whose tasks are TensorFlow's, an MPIJob (kubeflow.org/v2beta1, mpi-operator v0.8) for one that
mpirun starts, each from its method's launcher (hvdps/launchers.py: ``Launcher.pods``), and the
results volume every job writes its run to.

JobSet, as its documentation (and hvdps' pods) rely on:
- each replicated job is one Indexed Job (``replicas: 1``) with ``parallelism = completions`` = the
  role's tasks; a pod's index is ``JOB_COMPLETION_INDEX``;
- ``spec.network`` gives each pod the DNS name ``<jobset>-<replicatedJob>-0-<index>.<subdomain>``
  through a headless service; tf_cluster/jobset.py builds TF_CONFIG from those names;
- the workers start once the PS pods are Ready, and TF2's chief (the coordinator) once the workers
  are (``dependsOn``, on the replicated job listed before); Ready means listening: a TCP readiness
  probe on the task's port;
- the JobSet succeeds when the pods of the role that ends the job have (``successPolicy``), so PS
  tasks never keep a finished job alive, and fails on the first failed pod (``failurePolicy``,
  ``backoffLimit: 0``): a classic job restarts as a whole from its checkpoints with ``--resume``;
- the finished JobSet is deleted after ``ttlSecondsAfterFinished``; its run stays on the volume.
"""
from tf_cluster import jobset as js

RESULTS_VOLUME = "results"
STARTS = ("ps", "worker", "chief")     # the order the roles start in, each once the one before is Ready
PORT_NAME = "tf-port"


def _container(name, image, argv, workdir, env=(), mounts=(), port=None, probe=False, cpu=None):
    c = {"name": name, "image": image, "workingDir": workdir, "command": list(argv[:1]), "args": list(argv[1:])}
    if env:
        c["env"] = list(env)
    if port:
        c["ports"] = [{"containerPort": port, "name": PORT_NAME}]
    if probe:
        c["readinessProbe"] = {"tcpSocket": {"port": port}, "periodSeconds": 2}
    if cpu:
        c["resources"] = {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}
    if mounts:
        c["volumeMounts"] = list(mounts)
    return c


def _results(claim, path):
    """(the volume, its mount) of the results claim."""
    return ({"name": RESULTS_VOLUME, "persistentVolumeClaim": {"claimName": claim}},
            {"name": RESULTS_VOLUME, "mountPath": path})


def _labels_env():
    """A pod's JobSet labels, through the Downward API: who it is, for its TF_CONFIG."""
    return [{"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}}
            for name, label in js.LABELS.items()]


def jobset(name, plan, image, claim, results_path, workdir="/app", port=2222, ttl_s=3600, cpu=None, namespace=None):
    """A JobSet of ``plan``'s TensorFlow tasks (hvdps.launchers.PodPlan, kind "JobSet")."""
    tasks = ",".join(f"{role}:{n}" for role, n in plan.tasks.items())
    env = [*_labels_env(), {"name": js.TASKS, "value": tasks}, {"name": js.SUBDOMAIN, "value": name},
           {"name": js.PORT, "value": str(port)}]
    volume, mount = _results(claim, results_path)
    jobs, before = [], None
    for role in [r for r in STARTS if r in plan.tasks]:
        n = plan.tasks[role]
        writes = role != "ps"              # every worker writes its own steps; the chief, the run
        pod = {"restartPolicy": "Never",
               "containers": [_container("tensorflow", image, plan.argv, workdir, env, [mount] if writes else (),
                                         port, probe=True, cpu=cpu)]}
        if writes:
            pod["volumes"] = [volume]
        job = {"name": role, "replicas": 1,
               "template": {"spec": {"parallelism": n, "completions": n, "completionMode": "Indexed",
                                     "backoffLimit": 0, "template": {"spec": pod}}}}
        if before:
            job["dependsOn"] = [{"name": before, "status": "Ready"}]
        jobs.append(job)
        before = role
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": meta,
            "spec": {"network": {"enableDNSHostnames": True, "subdomain": name, "publishNotReadyAddresses": True},
                     "successPolicy": {"operator": "All", "targetReplicatedJobs": [plan.ends]},
                     "failurePolicy": {"maxRestarts": 0},
                     "ttlSecondsAfterFinished": ttl_s,
                     "replicatedJobs": jobs}}


def mpijob(name, plan, image, claim, results_path, workdir="/app", ttl_s=3600, cpu=None, namespace=None):
    """An MPIJob of ``plan`` (kind "MPIJob"): the launcher runs mpirun, the workers sshd, where the
    operator's hostfile and ssh keys (``sshAuthMountPath``) let mpirun start the ranks; the ranks
    (rank 0 writes the run) run on the workers, which mount the results."""
    volume, mount = _results(claim, results_path)
    root = [{"name": "OMPI_ALLOW_RUN_AS_ROOT", "value": "1"}, {"name": "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "value": "1"}]
    launcher = {"restartPolicy": "Never",
                "containers": [_container("mpi-launcher", image, plan.argv, workdir, root, cpu="500m" if cpu else None)]}
    worker = {"containers": [_container("mpi-worker", image, ("/usr/sbin/sshd", "-De"), workdir, mounts=[mount],
                                        cpu=cpu)],
              "volumes": [volume]}
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": meta,
            "spec": {"slotsPerWorker": 1, "sshAuthMountPath": "/root/.ssh", "mpiImplementation": "OpenMPI",
                     "launcherCreationPolicy": "WaitForWorkersReady",
                     "runPolicy": {"cleanPodPolicy": "Running", "ttlSecondsAfterFinished": ttl_s, "backoffLimit": 0},
                     "mpiReplicaSpecs": {
                         "Launcher": {"replicas": 1, "template": {"spec": launcher}},
                         "Worker": {"replicas": plan.tasks["worker"], "template": {"spec": worker}}}}}


KINDS = {"JobSet": jobset, "MPIJob": mpijob}


def results_claim(claim, storage, namespace=None):
    """The ReadWriteMany claim every job's writers mount: the runs outlive their pods."""
    meta = {"name": claim, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta,
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": storage}}}}


def results_reader(claim, results_path, image, namespace=None):
    """A pod that mounts the results read-only, to copy the runs out (kubectl cp) once the jobs end."""
    meta = {"name": f"{claim}-reader", **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "reader", "image": image, "command": ["sleep", "3600"],
                                     "volumeMounts": [{"name": RESULTS_VOLUME, "mountPath": results_path,
                                                       "readOnly": True}]}],
                     "volumes": [{"name": RESULTS_VOLUME, "persistentVolumeClaim": {"claimName": claim}}]}}
