"""A run directory (``--train_dir``): what it holds, whether it can be written or resumed, its weights.

Checked early on every worker, so a run that cannot be written, or a ``--resume`` into another job,
is one ``error:`` line before anything in the directory changes.
"""
import os

import numpy as np

from common.base.errors import UsageError
from common.base.files import refuse_link, writable_dir, write_atomic
from common.formats.schemas import read_checkpoint_index, read_config, read_weights
from common.trainer.metrics import read_metrics
from common.inputs.data import data_fingerprint, data_shards
from common.inputs.records import RecordError


# Every fixed name a run writes in its --train_dir (event and checkpoint files inside the two
# folders are named by TensorFlow, created fresh and renamed into place).
RUN_OUTPUTS = ("config.json", "metrics.jsonl", "weights.npz", "launch.json", "elastic_job", "links.json",
               "compare_run.json", "checkpoints", "tensorboard", os.path.join("checkpoints", "checkpoint"))


def check_train_dir(cfg, joining=False):
    """Fail early, on every worker, if results cannot be written or resumed from.

    ``joining``: this process joins a job already under way (elastic Horovod), so
    the run it finds in the directory is its own.
    """
    d = cfg.train_dir
    if os.path.exists(d) and not os.path.isdir(d):
        raise UsageError(f"--train_dir {d} exists and is not a directory")
    if cfg.resume and not os.path.isdir(d):      # refused without creating anything
        raise UsageError(f"--resume: no readable checkpoint directory at {os.path.join(d, 'checkpoints')}")
    writable_dir(d, "--train_dir")
    for name in RUN_OUTPUTS:     # TF's checkpoint and event writers would follow a planted link
        refuse_link(os.path.join(d, name), "a run's output")
    ckpt = os.path.join(d, "checkpoints")
    if cfg.resume and (not os.path.isdir(ckpt) or not os.access(ckpt, os.R_OK | os.X_OK)):
        raise UsageError(f"--resume: no readable checkpoint directory at {ckpt}")
    if cfg.resume and not os.path.exists(os.path.join(ckpt, "checkpoint")):
        raise UsageError(f"--resume: no checkpoint saved yet in {ckpt}")
    if not cfg.resume and not joining and os.path.exists(os.path.join(d, "metrics.jsonl")):
        raise UsageError(f"--train_dir {d} already holds a run (metrics.jsonl); "
                         f"use --resume to continue it or choose another directory")


def check_resume_compatible(cfg, train_dir, backend=None):
    """A resumed run continues exactly the job that was checkpointed, or is refused before a
    file in the run directory changes (exit 2).

    The same model, data and batch (config.json), and, from the run's first header in
    metrics.jsonl, the same backend and mode, the same number of workers and PS tasks and the
    same training data (a fingerprint of its arrays). A different world size would restart
    the data order at the wrong position, rescale the learning rate and mis-count the samples
    of every update already taken; hvdps does not convert a checkpoint, it refuses.
    ``backend``: the job being resumed into, once known (every rank can check: no exchange)."""
    index = os.path.join(train_dir, "checkpoints", "checkpoint")
    if os.path.lexists(index) and read_checkpoint_index(index) is None:    # TensorFlow: a bare ValueError
        raise UsageError(f"--resume: no checkpoint in {os.path.dirname(index)} (its 'checkpoint' index names none)")
    path = os.path.join(train_dir, "config.json")
    if not os.path.exists(path):
        raise UsageError(f"--resume: {path} is missing")
    old = read_config(path)
    for key in ("model", "dataset", "batch_size", "hidden_units", "image_shape", "num_classes", "seed",
                "synthetic_samples", "embedding_rows", "embedding_dim", "optimizer", "shuffle", "seq_len",
                "transformer_size", "precision", "jit_compile"):
        if getattr(old, key) != getattr(cfg, key):
            raise UsageError(f"--resume: {key} was {getattr(old, key)!r} in {path}, now "
                             f"{getattr(cfg, key)!r}")
    if backend is None:
        return
    first = next((r for r in read_metrics(os.path.join(train_dir, "metrics.jsonl")) if r.type == "header"), None)
    if first is None:
        raise UsageError(f"--resume: {train_dir}/metrics.jsonl has no header: not a run hvdps can continue")
    now = {"backend": backend.name, "mode": backend.mode, "world_size": backend.world_size, "tasks": dict(backend.tasks)}
    names = {"backend": "backend", "mode": "mode", "world_size": "workers", "tasks": "tasks besides the workers"}

    def said(value):
        return ",".join(f"{role}={n}" for role, n in value.items()) or "none" if isinstance(value, dict) else value
    for key, value in now.items():
        if key in first.model_fields_set and getattr(first, key) != value:
            raise UsageError(f"--resume: {train_dir} was trained with {names[key]} {said(getattr(first, key))}, this "
                             f"job has {said(value)}; a checkpoint resumes only into the job that wrote it (start a new "
                             f"--train_dir, or launch the same job)")
    try:
        shards = data_shards(cfg, verify=True) if first.data_shards else None   # every record read and checked
    except RecordError as exc:
        raise UsageError(f"--resume: {exc}; {train_dir} was trained on other bytes: start a new --train_dir")
    for name, digest in (first.data_shards or {}).items():
        if name in shards and shards[name] != digest:
            raise UsageError(f"--resume: {os.path.join(cfg.data_dir, name)} changed since {train_dir} was trained "
                             f"on it (its records differ); a run resumes only on the data it was trained on: "
                             f"start a new --train_dir")
    recorded, now = first.data_fingerprint, data_fingerprint(cfg, shards)
    if recorded and recorded != now:
        raise UsageError(f"--resume: the training data differ from those {train_dir} was trained on "
                         f"(fingerprint {recorded[:12]}, now {now[:12]})")


def refuse_finished(cfg, step, total):
    """A resumed run must have steps left: else one line saying how to train further."""
    if step >= total:
        raise UsageError(f"--resume: {cfg.train_dir} is already at step {step} of {total}; "
                         f"raise --epochs or --train_steps to train further")
    return step


def save_weights_npz(weights, path):
    """Final weights (arrays in model order), written atomically: tests and users diff these."""
    write_atomic(path, lambda f: np.savez(f, *[np.asarray(w) for w in weights]))


def load_weights_npz(path):
    return read_weights(path)
