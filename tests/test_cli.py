"""Every entry point: bad input is one 'error:' line and exit 2, never a traceback, a hang or a leftover."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from common.spec.config import Config
from common.inputs.data import MNIST_FILES, write_idx
from tests.conftest import BIN, REPO, VALID_BACKENDS, env, run, snapshot

HVD = [sys.executable, os.path.join(REPO, "horovod_train", "main.py")]
PS = [sys.executable, os.path.join(REPO, "ps_train", "main.py")]
MPI = [sys.executable, os.path.join(REPO, "mpi_train", "main.py")]
MWMS_TRAIN = [sys.executable, os.path.join(REPO, "mwms_train", "main.py")]
PS_FLAGS = ["--job_name=worker", "--ps_hosts=127.0.0.1:1", "--worker_hosts=127.0.0.1:2"]
LAUNCH = [sys.executable, "-m", "ps_train.launch"]
MWMS_LAUNCH = [sys.executable, "-m", "mwms_train.launch"]
COMPARE = [os.path.join(BIN, "hvdps"), "compare"]
PROJECT = [os.path.join(BIN, "hvdps"), "project"]
HOSTS = [os.path.join(BIN, "hvdps"), "hosts"]
K8S = [os.path.join(BIN, "hvdps"), "k8s"]
TUNE = [os.path.join(BIN, "hvdps"), "tune"]
IMAGE = ["--image", "registry.example.com/hvdps:1"]
MPIRUN = ["mpirun", "-np", "2", "--mca", "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo",
          "-x", "PATH", "-x", "PYTHONPATH", "-x", "TF_CPP_MIN_LOG_LEVEL", *HVD]
LIST_TYPE = json.dumps({"cluster": {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]},
                        "task": {"type": ["worker"], "index": 0}})
BW = ["--bandwidth_gbps", "25", "--latency_us", "10", "--step_compute_ms", "100"]

# (entry point, arguments, extra environment, start of the one error line). {tmp}: the test's folder,
# holding the files made by `files` below.
CASES = [
    # ---- bare-MPI trainer (shares the Horovod trainer's flags and checks)
    (MPI, ["--probe_steps", "-1"], {}, "error: --probe_steps must be >= 0, got -1"),
    (MPI, ["--model", "alexnet"], {}, "error: unknown model 'alexnet'"),
    (MPI, ["--loop", "fit"], {}, "error: unrecognized arguments: --loop fit"),
    (MPI, [], {"HOROVOD_RANK": "0"}, "error: the mpi backend needs mpirun"),   # under horovodrun's Gloo
    # ---- Horovod trainer
    (HVD, ["--model", "alexnet"], {}, "error: unknown model 'alexnet' (valid: mlp, cnn, rec, transformer, resnet50, resnet101, "
                                       "inception_v3, vgg16, mobilenet_v2, or module:function"),
    (HVD, ["--dataset", "cifar"], {}, "error: unknown dataset 'cifar' (valid: digits, mnist, synthetic, clicks, pysrc, tfrecord, or "),
    (HVD, ["--batch_size", "-1"], {}, "error: --batch_size must be positive, got -1"),
    (HVD, ["--batch_size", "x"], {}, "error: argument --batch_size: invalid int value: 'x'"),
    (HVD, ["--dataset", "mnist"], {}, "error: --dataset mnist needs --data_dir"),
    (HVD, ["--dataset", "mnist", "--data_dir", "/nope"], {}, "error: --data_dir /nope: no such directory"),
    (HVD, ["--dataset", "mnist", "--data_dir", "{tmp}/mnist8"], {}, "error: {tmp}/mnist8: train images are 8x8"),
    (HVD, ["--dataset", "mnist", "--data_dir", "{tmp}/empty"], {}, "error: {tmp}/empty: neither mnist.npz nor"),
    (HVD, ["--bogus"], {}, "error: unrecognized arguments: --bogus"),
    (HVD, ["--loop", "weird"], {}, "error: argument --loop: invalid choice"),
    (HVD, ["--batch_size", "5000"], {}, "error: batch 5000 x 1 workers exceeds the 1438 training examples"),
    (HVD, ["--threads_per_worker", "-1"], {}, "error: --threads_per_worker must be >= 0, got -1"),
    (HVD, ["--cycle_time_ms", "-2"], {}, "error: --cycle_time_ms must be >= 0"),
    (HVD, ["--fusion_threshold_mb", "inf"], {}, "error: --fusion_threshold_mb must be a finite number, got inf"),
    (HVD, ["--learning_rate", "nan"], {}, "error: --learning_rate must be a finite number, got nan"),
    (HVD, ["--lr_warmup_epochs", "nan"], {}, "error: --lr_warmup_epochs must be a finite number, got nan"),
    (HVD, ["--momentum", "inf"], {}, "error: --momentum must be a finite number, got inf"),
    (HVD, ["--target_accuracy", "nan"], {}, "error: --target_accuracy must be a finite number, got nan"),
    (HVD, ["--epochs", "0"], {}, "error: nothing to train"),
    (HVD, ["--image_shape", "1,2", "--dataset", "synthetic"], {}, "error: --image_shape must be H,W,C"),
    (HVD, ["--model", "resnet50"], {}, "error: --model resnet50 needs 3-channel images of at least 32x32"),
    (HVD, ["--model", "inception_v3", "--dataset", "synthetic", "--image_shape", "64,64,3"], {},
     "error: --model inception_v3 needs --image_shape of at least 75,75,3"),
    (HVD, ["--train_dir", "/proc/hvdps-x"], {}, "error: --train_dir /proc/hvdps-x is not writable"),
    (HVD, ["--resume", "--train_dir", "{tmp}/fresh"], {}, "error: --resume: no readable checkpoint directory"),
    # ---- PS trainer, one role
    (PS, [*PS_FLAGS, "--model", "alexnet"], {}, "error: unknown model 'alexnet'"),
    (PS, [*PS_FLAGS, "--optimizer", "lamb"], {}, "error: unknown optimizer 'lamb' (valid: sgd, momentum, adam)"),
    (PS, [*PS_FLAGS, "--startup_timeout", "-1"], {}, "error: --startup_timeout must be in [1, 604800], got -1.0"),
    (PS, [*PS_FLAGS, "--step_timeout", "1e17"], {}, "error: --step_timeout must be in [1, 604800], "
                                                    "got 1e+17"),
    (PS, [*PS_FLAGS, "--replicas_to_aggregate", "2"], {}, "error: --replicas_to_aggregate applies to synchronous"),
    (LAUNCH, ["--replicas_to_aggregate", "2"], {}, "error: --replicas_to_aggregate applies to synchronous"),
    (HVD, ["--seed", "-1"], {}, "error: --seed must be in [0, 4294967295], got -1"),
    (COMPARE, ["--seed", "4294967296"], {}, "error: --seed must be in [0, 4294967295], got 4294967296"),
    (PS, [*PS_FLAGS, "--startup_timeout", "nan"], {}, "error: --startup_timeout must be a finite number, got nan"),
    (PS, [*PS_FLAGS, "--step_timeout", "inf"], {}, "error: --step_timeout must be a finite number, got inf"),
    (COMPARE, ["--step_timeout", "0.001"], {}, "error: --step_timeout must be in [1, 604800], got 0.001"),
    (HVD, ["--startup_timeout", "0.5"], {}, "error: --startup_timeout must be in [1, 604800], got 0.5"),
    (PS, [*PS_FLAGS, "--sync", "--replicas_to_aggregate", "-1"], {}, "error: --replicas_to_aggregate must be >= 0"),
    (PS, [*PS_FLAGS, "--backup_workers", "1"], {}, "error: --backup_workers applies to synchronous training"),
    (PS, [*PS_FLAGS, "--sync", "--backup_workers", "-1"], {}, "error: --backup_workers must be >= 0"),
    (PS, [*PS_FLAGS, "--sync", "--backup_workers", "1", "--replicas_to_aggregate", "1"], {},
     "error: --backup_workers K means --replicas_to_aggregate N - K: give one of them"),
    (PS, [*PS_FLAGS, "--sync", "--backup_workers", "1"], {},
     "error: --backup_workers 1 leaves no gradient to wait for: 1 worker has none to spare"),
    (LAUNCH, ["--backup_workers", "1"], {}, "error: --backup_workers applies to synchronous training"),
    (COMPARE, ["--backends", "ps:backup0"], {}, "error: backend ps:backupK: K backup workers, a whole number from 1"),
    (COMPARE, ["--straggler", "1:0"], {}, "error: --straggler: the slowdown factor must be in [1, 1000], got '0'"),
    (COMPARE, ["--stall", "1:10"], {}, "error: --stall expects RANK:EVERY_MS:FOR_MS like 1:2000:500"),
    (COMPARE, ["--workers", "1", "--straggler", "1:4"], {}, "error: --straggler: worker 1 is in no run"),
    (COMPARE, ["--slow_link", "h2=10mbit"], {}, "error: --slow_link shapes one host's link of hvdps emulate's cluster"),
    (COMPARE, ["--slow_link", "h2"], {}, "error: --slow_link expects hN=RATE like h3=10mbit"),
    (PS, [*PS_FLAGS, "--bind", "999.1.1.1"], {}, "error: --bind 999.1.1.1: expected an IP address"),
    (PS, [*PS_FLAGS, "--bind", "10.255.255.254"], {}, "error: --bind 10.255.255.254: not an address of this machine"),
    (PS, ["--job_name=worker", "--task_index=5", "--ps_hosts=127.0.0.1:1", "--worker_hosts=127.0.0.1:2"], {},
     "error: --task_index 5 out of range for job 'worker' (0..0)"),
    (PS, [], {"TF_CONFIG": LIST_TYPE}, "error: TF_CONFIG: task type must be a string"),
    (PS, [], {"TF_CONFIG": "[1, 2]"}, "error: TF_CONFIG must have 'cluster' and 'task' keys"),
    (PS, ["--job_name=worker", "--cluster_spec", "{tmp}/binary"], {}, "error: {tmp}/binary: not a text file"),
    # ---- local PS launcher
    (LAUNCH, ["--num_workers", "0"], {}, "error: --num_ps and --num_workers must be at least 1"),
    (LAUNCH, ["--job_name", "ps"], {}, "error: --job_name is chosen by the launcher"),
    (LAUNCH, ["--run_timeout", "nan"], {}, "error: --run_timeout must be a finite number, got nan"),
    (LAUNCH, ["--learning_rate", "nan"], {}, "error: --learning_rate must be a finite number, got nan"),
    (LAUNCH, ["--step_timeout", "inf"], {}, "error: --step_timeout must be a finite number, got inf"),
    (LAUNCH, ["--threads_per_worker", "-1"], {}, "error: --threads_per_worker must be >= 0, got -1"),
    (LAUNCH, ["--num_ps", "many"], {}, "error: argument --num_ps: invalid int value: 'many'"),
    (LAUNCH, ["--rsh", "ssh"], {}, "error: --rsh, --ps_placement and --port apply only with --hosts"),
    (LAUNCH, [], {"TF_CONFIG": LIST_TYPE}, "error: TF_CONFIG is set: the launcher chooses the cluster"),
    # ---- comparison, projection, hosts
    (COMPARE, ["--backends", "mxnet"], {}, f"error: unknown backend 'mxnet' (valid: {VALID_BACKENDS})"),
    (COMPARE, ["--backends", "ps:lazy"], {}, "error: backend ps has no mode 'lazy' (valid: async, sync)"),
    (COMPARE, ["--backends", "horovod[cycle=1]"], {}, "error: --backends horovod[cycle=1]: horovod has no setting "
                                                      "'cycle' (horovod's settings: cycle_time_ms 0..1000"),
    (COMPARE, ["--backends", "horovod[cycle_time_ms=2000]"], {}, "error: --backends horovod[cycle_time_ms=2000]: "
                                                                 "'cycle_time_ms=2000' is not a value of cycle_time_ms"),
    (COMPARE, ["--workers", "0"], {}, "error: --workers expects positive numbers"),
    (COMPARE, ["--workers", "a,b"], {}, "error: --workers expects numbers like 1,2,4"),
    (COMPARE, ["--run_timeout", "-5"], {}, "error: --run_timeout must be positive, got -5.0"),
    (COMPARE, ["--num_ps", "0"], {}, "error: argument --num_ps: expected counts from 1 to 1048576 like 1,2,4, got '0'"),
    (COMPARE, ["--num_ps", "1,x"], {}, "error: argument --num_ps: expected numbers like 1,2,4, got '1,x'"),
    (COMPARE, ["--from", "{tmp}/junkrun"], {}, "error: {tmp}/junkrun/metrics.jsonl:4: backend: field required"),
    (COMPARE, ["--learning_rate", "inf"], {}, "error: --learning_rate must be a finite number, got inf"),
    (PROJECT, ["--bandwidth_gbps", "nan", "--latency_us", "10"], {}, "error: --bandwidth_gbps must be a finite"),
    (PROJECT, [*BW, "--model_name", "alexnet"], {}, "error: unknown --model_name 'alexnet'"),
    (PROJECT, [*BW, "--model_name", "vgg16", "--cycle_time_ms", "-1"], {}, "error: --cycle_time_ms must be >= 0, got -1.0"),
    (PROJECT, [*BW, "--from", "{tmp}/junkrun"], {}, "error: {tmp}/junkrun/metrics.jsonl:4: backend: field required"),
    (PROJECT, [*BW, "--from", "{tmp}/okrun"], {}, "error: --from {tmp}/okrun: no run has a per-step breakdown"),
    (PROJECT, [*BW, "--from", "{tmp}/hangrun", "--run_timeout", "3"], {},
     "error: --from {tmp}/hangrun: cannot rebuild the run's model (--model {tmp}/hangs_on_import.py:build: importing "
     "{tmp}/hangs_on_import.py did not return within 3 s (--run_timeout)"),
    (PROJECT, ["--comm_json", "/nope"], {}, "error: --comm_json /nope: no such file"),
    (HOSTS, ["{tmp}/binary"], {}, "error: {tmp}/binary: not a text file"),
    (HOSTS, ["{tmp}/inventory", "--port", "65535"], {}, "error: --port 65535: host a needs ports up to 65536"),
    (HOSTS, ["{tmp}/inventory", "--tasks", "worker=2"], {},
     "error: argument --tasks: 'worker=2': expected ROLE=N with ROLE one of chief, ps, evaluator"),
    (HOSTS, ["{tmp}/inventory", "--tasks", "ps=0"], {}, "error: argument --tasks: 'ps=0': expected ps=N once, N from 1 to 4096"),
    (HOSTS, ["{tmp}/badslots"], {}, "error: {tmp}/badslots:1: slots must be a positive integer, got 'two'"),
    (HOSTS, ["/nope"], {}, "error: /nope: cannot read hostfile"),
    (HOSTS, ["{tmp}/maxslots"], {}, "error: {tmp}/maxslots:1: slots=4 is more than max_slots=1"),
    (HOSTS, ["{tmp}/twoslots"], {}, "error: {tmp}/twoslots:1: slots given twice"),
    (HOSTS, ["{tmp}/hugeslots"], {}, "error: {tmp}/hugeslots:1: slots must be at most 4096, got 1000000000000"),
    (PROJECT, ["--bandwidth_gbps", "1e-320", "--latency_us", "10"], {},
     "error: --bandwidth_gbps must be in [1e-06, 1e+06], got 1e-320"),
    (PROJECT, [*BW, "--model_params", "1e305"], {}, "error: --model_params must be in [1, 1e+13], got 1e+305"),
    (PROJECT, [*BW, "--max_workers", "10000000000000000"], {}, "error: --max_workers must be in [1, 65536], "
                                                               "got 10000000000000000"),
    # ---- data that would train silently wrong, refused before any process joins a job (built-in and plug-in)
    # ---- a plug-in that never returns: stopped by the run's own time budget, and named
    (COMPARE, ["--model", "{tmp}/hangs_on_import.py:build", "--run_timeout", "3", "--dry_run"], {},
     "error: --model {tmp}/hangs_on_import.py:build: importing {tmp}/hangs_on_import.py did not return within 3 s "
     "(--run_timeout)"),
    (COMPARE, ["--dataset", "{tmp}/plug.py:never_returns", "--run_timeout", "3", "--out", "{tmp}/out"], {},
     "error: --dataset {tmp}/plug.py:never_returns: the plug-in did not return within 3 s (--run_timeout)"),
    (LAUNCH, ["--dataset", "{tmp}/plug.py:spins", "--run_timeout", "3"], {},
     "error: --dataset {tmp}/plug.py:spins: the plug-in did not return within 3 s (--run_timeout)"),
    (MWMS_LAUNCH, ["--dataset", "{tmp}/plug.py:swallows_everything", "--run_timeout", "3"], {},
     "error: --dataset {tmp}/plug.py:swallows_everything: the plug-in did not return within 3 s (--run_timeout)"),
    (LAUNCH, ["--num_ps", "100000"], {}, "error: --num_ps 100000 and --num_workers 2: 100002 tasks on this machine"),
    # the dry run checks the input as the real run does: a TFRecord folder without its description
    (COMPARE, ["--dataset", "tfrecord", "--data_dir", "{tmp}/empty", "--dry_run"], {},
     "error: --data_dir {tmp}/empty: no dataset.json (write TFRecord shards with `hvdps data`)"),
    (COMPARE, ["--workers", "100000", "--dataset", "synthetic", "--synthetic_samples", "200000", "--batch_size", "1",
               "--dry_run"], {}, "error: run ps-async-w100000-ps1: 100001 tasks, more than the "
                                                          "1024 one machine runs"),
    (COMPARE, ["--workers", "8", "--hosts", "127.0.0.1:2,127.0.0.2:2", "--rsh", "/bin/true", "--dry_run"], {},
     "error: --hosts has 4 slot(s) in all, 8 workers asked for"),
    (COMPARE, ["--train_dir", ""], {}, "error: --train_dir must not be empty"),
    # ---- a model plug-in that is not quite right: named in one line before training (one process per
    # entry point here; every way it can be wrong, in process: test_a_model_plugin_that_cannot_train_...)
    (HVD, ["--model", "{tmp}/plug.py:int_logits"], {}, "error: --model {tmp}/plug.py:int_logits: the model outputs "
                                                       "int32 logits"),
    (MPI, ["--model", "{tmp}/plug.py:no_gradient"], {}, "error: --model {tmp}/plug.py:no_gradient: no gradient "
                                                        "reaches the model's weights"),
    # ... the same check before any task starts under the strategies and the classic PS
    (MWMS_LAUNCH, ["--model", "{tmp}/plug.py:fails_in_training"], {}, "error: --model {tmp}/plug.py:fails_in_training: "
                                                                      "the model fails in training mode: RuntimeError"),
    (LAUNCH, ["--ps_api", "v2", "--model", "{tmp}/plug.py:no_gradient"], {},
     "error: --model {tmp}/plug.py:no_gradient: no gradient reaches the model's weights"),
    (LAUNCH, ["--sync", "--model", "{tmp}/plug.py:fails_in_training"], {},
     "error: --model {tmp}/plug.py:fails_in_training: the model fails in training mode: RuntimeError"),
    (COMPARE, ["--backends", "mwms", "--workers", "2", "--model", "{tmp}/plug.py:two_outputs"], {},
     "error: --model {tmp}/plug.py:two_outputs: the model returns 2 outputs"),
    # ---- a resume with an empty checkpoint index: refused before a task starts or a file changes
    (HVD, ["--resume", "--train_dir", "{tmp}/emptyidx"], {},
     "error: --resume: no checkpoint in {tmp}/emptyidx/checkpoints (its 'checkpoint' index names none)"),
    (LAUNCH, ["--resume", "--train_dir", "{tmp}/emptyidx"], {},
     "error: --resume: no checkpoint in {tmp}/emptyidx/checkpoints (its 'checkpoint' index names none)"),
    (MWMS_LAUNCH, ["--resume", "--train_dir", "{tmp}/emptyidx"], {},
     "error: --resume: no checkpoint in {tmp}/emptyidx/checkpoints (its 'checkpoint' index names none)"),
    (COMPARE, ["--hosts", ""], {}, "error: --hosts must not be empty"),
    (HVD, ["--train_dir", " "], {}, "error: --train_dir must not be empty"),
    (HVD, ["--dataset", "{tmp}/plug.py:overflow_data"], {}, "error: --dataset {tmp}/plug.py:overflow_data: x_train has "
                                                            "values beyond float32's range (|x| > 3.4e38) in 1 "
                                                            "example(s), the first at index 2"),
    (HVD, ["--dataset", "{tmp}/plug.py:nan_data"], {}, "error: --dataset {tmp}/plug.py:nan_data: x_train has NaN or "
                                                       "infinite values in 1 example(s), the first at index 3"),
    (HVD, ["--dataset", "{tmp}/plug.py:inf_test"], {}, "error: --dataset {tmp}/plug.py:inf_test: x_test has NaN"),
    (HVD, ["--dataset", "{tmp}/plug.py:wrapping_label"], {}, "error: --dataset {tmp}/plug.py:wrapping_label: y_train "
                                                             "holds class ids 0..4294967297; expected 0..16777215"),
    (HVD, ["--dataset", "{tmp}/plug.py:huge_label"], {}, "error: --dataset {tmp}/plug.py:huge_label: y_train holds "
                                                         "class ids 0..2147483647"),
    (HVD, ["--dataset", "{tmp}/plug.py:negative_label"], {}, "error: --dataset {tmp}/plug.py:negative_label: y_train "
                                                             "holds class ids -1..2"),
    (HVD, ["--dataset", "{tmp}/plug.py:complex_data"], {}, "error: --dataset {tmp}/plug.py:complex_data: x_train has "
                                                           "dtype complex128; expected real numbers"),
    (HVD, ["--dataset", "{tmp}/plug.py:text_data"], {}, "error: --dataset {tmp}/plug.py:text_data: x_train has dtype <U"),
    (HVD, ["--dataset", "{tmp}/plug.py:no_columns"], {}, "error: --dataset {tmp}/plug.py:no_columns: x_train has "
                                                         "shape (10, 0); each example needs at least one feature"),
    (HVD, ["--dataset", "{tmp}/plug.py:float_labels"], {}, "error: --dataset {tmp}/plug.py:float_labels: y_train has "
                                                           "shape (10,) and dtype float64"),
    (HVD, ["--dataset", "{tmp}/plug.py:empty_train"], {}, "error: --dataset {tmp}/plug.py:empty_train: the train "
                                                          "split is empty"),
    (HVD, ["--dataset", "{tmp}/plug.py:short_labels"], {}, "error: --dataset {tmp}/plug.py:short_labels: y_train has "
                                                           "shape (9,)"),
    (HVD, ["--dataset", "{tmp}/plug.py:mixed_shapes"], {}, "error: --dataset {tmp}/plug.py:mixed_shapes: train "
                                                           "examples are (4,), test examples (5,)"),
    (HVD, ["--dataset", "{tmp}/plug.py:three_arrays"], {}, "error: --dataset {tmp}/plug.py:three_arrays: returned "
                                                           "tuple, expected"),
    (HVD, ["--dataset", "{tmp}/plug.py:exits"], {}, "error: --dataset {tmp}/plug.py:exits: the plug-in called "
                                                    "sys.exit(0) instead of returning"),
    (HVD, ["--dataset", "{tmp}/plug.py:raises"], {}, "error: --dataset {tmp}/plug.py:raises: the plug-in raised "
                                                     "ValueError: no data here"),
    (HVD, ["--dataset", "{tmp}/plug.py:missing"], {}, "error: --dataset {tmp}/plug.py:missing: {tmp}/plug.py has no "
                                                      "attribute 'missing'"),
    (HVD, ["--dataset", "{tmp}/exits_on_import.py:load"], {}, "error: --dataset {tmp}/exits_on_import.py:load: "
                                                              "importing {tmp}/exits_on_import.py called sys.exit(3)"),
    (PS, [*PS_FLAGS, "--dataset", "{tmp}/plug.py:nan_data"], {}, "error: --dataset {tmp}/plug.py:nan_data: x_train "
                                                                 "has NaN"),
    (MPI, ["--dataset", "{tmp}/plug.py:wrapping_label"], {}, "error: --dataset {tmp}/plug.py:wrapping_label: y_train"),
    (LAUNCH, ["--dataset", "{tmp}/plug.py:complex_data"], {}, "error: --dataset {tmp}/plug.py:complex_data: x_train"),
    (COMPARE, ["--dataset", "{tmp}/plug.py:nan_data"], {}, "error: --dataset {tmp}/plug.py:nan_data: x_train has NaN"),
    # ---- sizes that would exhaust memory: refused from their shapes before anything is allocated
    (COMPARE, ["--dataset", "{tmp}/plug.py:huge_view", "--out", "{tmp}/out"], {},
     "error: --dataset {tmp}/plug.py:huge_view: x_train (10000000000, 4) is 186.3 GiB as float32 examples"),
    (HVD, ["--dataset", "synthetic", "--num_classes", "16777216", "--hidden_units", "1", "--batch_size", "128"], {},
     "error: --num_classes 16777216 x --batch_size 128: about"),
    (HVD, ["--dataset", "mnist", "--data_dir", "{tmp}/mnist_nan"], {}, "error: {tmp}/mnist_nan: x_train has NaN or "
                                                                       "infinite values in 1 example(s), the first at "
                                                                       "index 2"),
    (HVD, ["--dataset", "mnist", "--data_dir", "{tmp}/mnist_float_labels"], {},
     "error: {tmp}/mnist_float_labels/mnist.npz: train labels have dtype float64"),
    (HVD, ["--dataset", "mnist", "--data_dir", "{tmp}/mnist_wrap"], {}, "error: {tmp}/mnist_wrap/mnist.npz: train "
                                                                        "label out of range 0..9"),
    (HVD, ["--dataset", "mnist", "--data_dir", "{tmp}/mnist_fifo"], {},
     "error: {tmp}/mnist_fifo/train-images-idx3-ubyte: an IDX file is not a regular file"),
    (HVD, ["--dataset", "mnist", "--data_dir", "{tmp}/npz_fifo"], {},
     "error: {tmp}/npz_fifo/mnist.npz: an .npz file is not a regular file"),
    # ---- sizes that cannot fit: refused with the estimate, not a MemoryError
    (HVD, ["--hidden_units", "2000000000"], {}, "error: --hidden_units 2000000000: about "),
    (HVD, ["--dataset", "synthetic", "--image_shape", "4000,4000,3"], {},
     "error: --image_shape 4000,4000,3 x --synthetic_samples 2048: about "),
    (LAUNCH, ["--model", "cnn", "--dataset", "synthetic", "--image_shape", "8000,8000,1",
              "--synthetic_samples", "8"], {}, "error: --image_shape 8000,8000,1: about "),
    # an example past the bound (a typo, a crafted shape): refused from its size alone
    (HVD, ["--dataset", "synthetic", "--image_shape", "100000,100000,3"], {},
     "error: --image_shape 100000,100000,3: 30,000,000,000 values an example; hvdps takes at most 67,108,864"),
    (COMPARE, ["--hidden_units", "2000000000"], {}, "error: --hidden_units 2000000000: about "),
    # each task fits, all 17 of the largest run do not (ps async at 16 workers, 1 PS: 5.4 GiB each)
    (COMPARE, ["--workers", "4,16", "--dataset", "synthetic", "--image_shape", "64,64,3", "--hidden_units", "20000",
               "--out", "{tmp}/big"], {}, "error: run ps-async-w16-ps1 starts 17 TensorFlow tasks on this machine"),
    # a dry run plans what the runs would start: its tasks, PS included, are bounded as theirs are
    (COMPARE, ["--dry_run", "--backends", "ps", "--num_ps", "20000", "--workers", "2", "--out", "{tmp}/many"], {},
     "error: run ps-async-w2-ps20000: 20002 tasks, more than the 1024 one machine runs"),
    # ---- resume: exactly the job that wrote the checkpoint, or refused before any file changes
    (HVD, ["--resume", "--train_dir", "{tmp}/hvd2run"], {}, "error: --resume: {tmp}/hvd2run was trained with workers "
                                                            "2, this job has 1"),
    (MPI, ["--resume", "--train_dir", "{tmp}/hvd2run"], {}, "error: --resume: {tmp}/hvd2run was trained with backend "
                                                            "horovod, this job has mpi"),
    (LAUNCH, ["--resume", "--train_dir", "{tmp}/hvd2run", "--num_workers", "2"], {},
     "error: --resume: {tmp}/hvd2run was trained with backend horovod, this job has ps"),
    (LAUNCH, ["--resume", "--train_dir", "{tmp}/ps1run", "--num_workers", "2"], {},
     "error: --resume: {tmp}/ps1run was trained with workers 1, this job has 2"),
    (LAUNCH, ["--resume", "--train_dir", "{tmp}/ps1run", "--num_workers", "1", "--sync"], {},
     "error: --resume: {tmp}/ps1run was trained with mode async, this job has sync"),
    (LAUNCH, ["--resume", "--train_dir", "{tmp}/ps1run", "--num_workers", "1", "--num_ps", "2"], {},
     "error: --resume: {tmp}/ps1run was trained with tasks besides the workers ps=1, this job has ps=2"),
    (LAUNCH, ["--resume", "--train_dir", "{tmp}/ps1run", "--num_workers", "1", "--ps_api", "v2"], {},
     "error: --resume: {tmp}/ps1run was trained with backend ps, this job has ps2"),
    (PS, [*PS_FLAGS, "--resume", "--train_dir", "{tmp}/ps1run", "--sync"], {},
     "error: --resume: {tmp}/ps1run was trained with mode async, this job has sync"),
    (HVD, ["--resume", "--train_dir", "{tmp}/otherdata"], {}, "error: --resume: the training data differ from those "),
    (HVD, ["--resume", "--train_dir", "{tmp}/hvd2run", "--batch_size", "16"], {},
     "error: --resume: batch_size was 32 in {tmp}/hvd2run/config.json, now 16"),
    (HVD, ["--resume", "--train_dir", "{tmp}/hvd2run", "--optimizer", "sgd"], {},
     "error: --resume: optimizer was 'adam' in {tmp}/hvd2run/config.json, now 'sgd'"),
    (COMPARE, ["--resume"], {}, "error: --resume does not apply to hvdps compare"),
    # ---- outputs: never through a planted link, never into something that is not a folder
    (HVD, ["--train_dir", "{tmp}/linkrun"], {}, "error: {tmp}/linkrun/metrics.jsonl is a symbolic link (to "),
    (PS, [*PS_FLAGS, "--train_dir", "{tmp}/linkrun"], {}, "error: {tmp}/linkrun/metrics.jsonl is a symbolic link"),
    (HVD, ["--train_dir", "{tmp}/binary"], {}, "error: --train_dir {tmp}/binary exists and is not a directory"),
    (COMPARE, ["--out", "{tmp}/binary"], {}, "error: --out {tmp}/binary exists and is not a directory"),
    (COMPARE, ["--out", "/proc/hvdps-x"], {}, "error: --out /proc/hvdps-x is not writable"),
    (COMPARE, ["--from", "{tmp}/okrun", "--out", "{tmp}/reported"], {}, "error: --out {tmp}/reported already holds a "
                                                                         "report"),
    (COMPARE, ["--batch_size", "5000"], {}, "error: batch 5000 x 2 workers exceeds the 1438 training examples"),
    (PROJECT, [*BW, "--model_name", "vgg16", "--out", "{tmp}/binary"], {}, "error: --out {tmp}/binary exists and is "
                                                                           "not a directory"),
    # ---- inputs that would block or never end: FIFOs and devices are refused before a byte is read
    (HOSTS, ["{tmp}/fifo"], {}, "error: {tmp}/fifo: hostfile is a FIFO, not a regular file"),
    (HOSTS, ["/dev/zero"], {}, "error: /dev/zero: hostfile is a device or socket, not a regular file"),
    (COMPARE, ["--from", "{tmp}/fiforun"], {}, "error: {tmp}/fiforun/metrics.jsonl: a metrics file is a FIFO, not a regular"),
    (PROJECT, [*BW, "--from", "{tmp}/fiforun"], {}, "error: {tmp}/fiforun/metrics.jsonl: a metrics file is a FIFO, not a "),
    (PS, ["--job_name=worker", "--cluster_spec", "{tmp}/fifo"], {}, "error: {tmp}/fifo: "),
    (COMPARE, ["--links", "{tmp}/fifo"], {}, "error: {tmp}/fifo: an hvdps emulate cluster description is a FIFO, not a regular file"),
    (PROJECT, ["--comm_json", "{tmp}/fifo", "--model_name", "vgg16"], {}, "error: {tmp}/fifo: a comm_bandwidth.py result file is a FIFO"),
    (PROJECT, ["--comm_json", "{tmp}/np1.json", "--model_name", "vgg16"], {},
     "error: {tmp}/np1.json: np: input should be greater than or equal to 2 (got 1)"),
    # ---- where tasks listen
    (LAUNCH, ["--host", "nonexistent.invalid"], {}, "error: --host nonexistent.invalid: cannot resolve it"),
    (LAUNCH, ["--host", "10.255.255.254"], {}, "error: --host 10.255.255.254: 10.255.255.254 is not an address of this"),
    (PS, [*PS_FLAGS, "--bind", "127.0.0.2"], {}, "error: --bind 127.0.0.2: the cluster gives this task 127.0.0.1"),
    # ---- more flags out of range, for every trainer
    (HVD, ["--log_every", "0"], {}, "error: --log_every must be positive, got 0"),
    (HVD, ["--num_classes", "0"], {}, "error: --num_classes must be positive, got 0"),
    (HVD, ["--synthetic_samples", "-3"], {}, "error: --synthetic_samples must be positive, got -3"),
    (HVD, ["--embedding_dim", "0"], {}, "error: --embedding_dim must be positive, got 0"),
    (HVD, ["--momentum", "1"], {}, "error: --lr_warmup_epochs must be >= 0 and --momentum in [0, 1)"),
    (HVD, ["--target_accuracy", "1.5"], {}, "error: --target_accuracy must be in (0, 1], got 1.5"),
    (HVD, ["--warmup_steps", "-1"], {}, "error: --warmup_steps must be >= 0, got -1"),
    (HVD, ["--checkpoint_steps", "-1"], {}, "error: --checkpoint_steps must be >= 0, got -1"),
    (HVD, ["--train_steps", "-4"], {}, "error: --train_steps must be >= 0, got -4"),
    (HVD, ["--image_shape", "a,b,c"], {}, "error: argument --image_shape: expected H,W,C such as 28,28,1"),
    (HVD, ["--image_shape", "0,28,1", "--dataset", "synthetic"], {}, "error: --image_shape must be H,W,C with"),
    (HVD, ["--model", "rec"], {}, "error: --model rec embeds categorical ids: it needs --dataset clicks"),
    (HVD, ["--dataset", "clicks"], {}, "error: --dataset clicks holds categorical ids, not pixels"),
    (HVD, ["--shuffle", "maybe"], {}, "error: argument --shuffle: expected true/false, got 'maybe'"),
    (MPI, ["--hidden_units", "0"], {}, "error: --hidden_units must be positive, got 0"),
    (MPI, ["--epochs", "-1"], {}, "error: --epochs must be >= 0, got -1"),
    (MPI, ["--seed", "4294967296"], {}, "error: --seed must be in [0, 4294967295], got 4294967296"),
    (PS, [*PS_FLAGS, "--batch_size", "0"], {}, "error: --batch_size must be positive, got 0"),
    (PS, [*PS_FLAGS, "--epochs", "0"], {}, "error: nothing to train"),
    (PS, [], {"TF_CONFIG": "{not json"}, "error: TF_CONFIG: not valid JSON"),
    # a JobSet pod's TF_CONFIG from its variables (tf_cluster/jobset.py): one missing, one bad
    (PS, [], {"HVDPS_JOBSET": "run", "HVDPS_REPLICATED_JOB": "worker", "HVDPS_TF_TASKS": "ps:1,worker:2"},
     "error: a JobSet pod's TF_CONFIG needs JOB_COMPLETION_INDEX, HVDPS_JOB_INDEX, HVDPS_SUBDOMAIN: not set"),
    (MWMS_TRAIN, [], {"HVDPS_JOBSET": "run", "HVDPS_REPLICATED_JOB": "worker", "HVDPS_TF_TASKS": "worker:2",
                      "HVDPS_SUBDOMAIN": "run", "HVDPS_JOB_INDEX": "0", "JOB_COMPLETION_INDEX": "2"},
     "error: JOB_COMPLETION_INDEX='2': expected a whole number in 0..1"),
    (LAUNCH, ["--max_restarts", "-1"], {}, "error: --max_restarts must be >= 0, got -1"),
    (LAUNCH, ["--momentum", "-0.5"], {}, "error: --momentum must be in [0, 1], got -0.5"),
    (LAUNCH, ["--seed", "-7"], {}, "error: --seed must be in [0, 4294967295], got -7"),
    (COMPARE, ["--backends", ""], {}, "error: --backends"),
    (COMPARE, ["--run_timeout", "nan"], {}, "error: --run_timeout must be a finite number, got nan"),
    (PROJECT, ["--bandwidth_gbps", "25", "--latency_us", "-1", "--step_compute_ms", "100"], {}, "error: --latency_us"),
    (PROJECT, [*BW, "--model_name", "vgg16", "--straggler_cv", "-1"], {}, "error: --straggler_cv must be in [0, 1], "
                                                                          "got -1.0"),
    # ---- hvdps tune: the budget, the worker count, the space, the cluster, its folder
    (TUNE, ["--budget", "0", "--out", "{tmp}/t"], {}, "error: --budget 0: at least 60 s"),
    (TUNE, ["--budget", "nan", "--out", "{tmp}/t"], {}, "error: --budget must be a finite number"),
    (TUNE, ["--budget", "soon", "--out", "{tmp}/t"], {}, "error: argument --budget: invalid float value"),
    (TUNE, ["--workers", "1,2", "--out", "{tmp}/t"], {}, "error: --workers 1,2: hvdps tune tunes at one worker count"),
    (TUNE, ["--backends", "horovod[cycle=1]", "--out", "{tmp}/t"], {}, "error: --backends horovod[cycle=1]: horovod has no axis 'cycle'"),
    (TUNE, ["--backends", "horovod[cycle_time_ms=0.1|fast]", "--out", "{tmp}/t"], {},
     "error: --backends horovod[cycle_time_ms=0.1|fast]: 'fast' is not a value of cycle_time_ms"),
    (TUNE, ["--backends", "ps:async|eventually", "--out", "{tmp}/t"], {}, "error: --backends ps:async|eventually: 'eventually' is not a value of mode"),
    (TUNE, ["--backends", "mpi,mpi", "--out", "{tmp}/t"], {}, "error: --backends names mpi twice"),
    (TUNE, ["--backends", "horovod[num_groups=0|1", "--out", "{tmp}/t"], {}, "error: --backends 'horovod[num_groups=0|1': a '[' is not closed"),
    (TUNE, ["--trial_steps", "0", "--out", "{tmp}/t"], {}, "error: --trial_steps must be"),
    (TUNE, ["--straggler", "1:2,1:4", "--out", "{tmp}/t"], {}, "error: hvdps tune tunes for one cluster"),
    (TUNE, ["--resume", "--out", "{tmp}/none"], {}, "error: --resume {tmp}/none: no tune there"),
    (TUNE, ["--resume", "--out", "{tmp}/none", "--model", "cnn"], {}, "error: --resume takes the tune's flags from"),
    (TUNE, ["--from", "{tmp}/none"], {}, "error: --from {tmp}/none: no tune there"),
    (K8S, [], {}, "error: the following arguments are required: --image"),
    (K8S, ["--image", "hvdps"], {}, "error: --image 'hvdps': name it with its tag"),
    (K8S, ["--image", "registry.example.com/hvdps:latest"], {}, "error: --image 'registry.example.com/hvdps:latest'"),
    (K8S, [*IMAGE, "--workers", "1"], {}, "error: --workers 1: no run has two or more workers"),
    (K8S, [*IMAGE, "--workers", "0"], {}, "error: --workers"),
    (K8S, [*IMAGE, "--storage", "lots"], {}, "error: --storage 'lots': not a Kubernetes quantity (a number and a "
                                             "suffix such as 10Gi)"),
    # what the API server, the kubelet or the trainer would refuse, refused before a manifest is written
    (K8S, ["--image", "hvdps:"], {}, "error: --image 'hvdps:': not an image reference"),
    (K8S, ["--image", ":v1"], {}, "error: --image ':v1': not an image reference"),
    (K8S, ["--image", "Hvdps:v1"], {}, "error: --image 'Hvdps:v1': a repository name is lower-case"),
    (K8S, [*IMAGE, "--namespace", "stra\u00dfe"], {}, "error: --namespace 'stra\u00dfe': not a DNS label (RFC 1123"),
    (K8S, [*IMAGE, "--storage", "0"], {}, "error: --storage '0': must be more than zero"),
    (K8S, [*IMAGE, "--storage", "\u0663Gi"], {}, "error: --storage '\u0663Gi': not a Kubernetes quantity"),
    (K8S, [*IMAGE, "--cpu", "0m"], {}, "error: --cpu '0m': must be more than zero"),
    (K8S, [*IMAGE, "--backends", "ps:backup2"], {}, "error: run ps-backup2-w2-ps1: ps:backup2 leaves no gradient to "
                                                   "wait for: at most ps:backup1 with 2 workers"),
    (K8S, [*IMAGE, "--kubernetes_version", "1.99.0"], {}, "error: --kubernetes_version '1.99.0': expected "
                                                          "1.MINOR.PATCH of a version the manifests are checked against"),
    (K8S, [*IMAGE, "--backends", "ps2", "--precision", "mixed_float16"], {}, "error: --precision mixed_float16 cannot "
                                                                             "run under TensorFlow 2's"),
    # the plan refuses what the job would refuse at its start (a dry run too)
    (COMPARE, ["--dry_run", "--backends", "ps:backup2", "--workers", "2"], {},
     "error: run ps-backup2-w2-ps1: ps:backup2 leaves no gradient to wait for: at most ps:backup1 with 2 workers"),
    (COMPARE, ["--dry_run", "--backends", "ps:backup1", "--workers", "1"], {},
     "error: run ps-backup1-w1-ps1: ps:backup1 leaves no gradient to wait for: 1 worker has none to spare"),
    (LAUNCH, ["--sync", "--backup_workers", "2", "--num_workers", "2"], {},
     "error: --backup_workers 2 leaves no gradient to wait for: at most --backup_workers 1 with 2 workers"),
    # numbers in other than ASCII digits, wherever they enter
    (COMPARE, ["--workers", "\u0663"], {}, "error: --workers expects numbers like 1,2,4, got '\u0663'"),
    (COMPARE, ["--backends", "localsgd:\u0663"], {}, "error: backend localsgd's mode is k"),
    (COMPARE, ["--backends", "ps:backup\u00b2"], {}, "error: backend ps:backupK: K backup workers, a whole number"),
    (COMPARE, ["--straggler", "1:\u0663"], {}, "error: --straggler: "),
    (HVD, ["--batch_size", "\u0663\u0662"], {}, "error: argument --batch_size: invalid int value: '\u0663\u0662'"),
    (HVD, ["--learning_rate", "\u0660.\u0661"], {}, "error: argument --learning_rate: invalid float value"),
    (HVD, ["--batch_size", "1_0"], {}, "error: argument --batch_size: invalid int value: '1_0'"),
    (PS, [], {"HVDPS_JOBSET": "run", "HVDPS_REPLICATED_JOB": "worker", "HVDPS_TF_TASKS": "ps:1,worker:2",
              "HVDPS_SUBDOMAIN": "run", "HVDPS_JOB_INDEX": "0", "JOB_COMPLETION_INDEX": "\u00b2"},
     "error: JOB_COMPLETION_INDEX='\u00b2': expected a whole number in 0..1"),
    (PS, [], {"HVDPS_JOBSET": "run", "HVDPS_REPLICATED_JOB": "worker", "HVDPS_TF_TASKS": "ps:\u0661,worker:2",
              "HVDPS_SUBDOMAIN": "run", "HVDPS_JOB_INDEX": "0", "JOB_COMPLETION_INDEX": "0"},
     "error: HVDPS_TF_TASKS: expected ROLE:COUNT"),
    (K8S, [*IMAGE, "--cpu", "four"], {}, "error: --cpu 'four'"),
    (K8S, [*IMAGE, "--claim", "Results"], {}, "error: --claim 'Results': not a DNS label"),
    (K8S, [*IMAGE, "--namespace", "a" * 64], {}, "error: --namespace"),
    (K8S, [*IMAGE, "--results_path", "results"], {}, "error: --results_path 'results': an absolute path"),
    (K8S, [*IMAGE, "--backends", "nope"], {}, "error: unknown backend 'nope'"),
    (K8S, [*IMAGE, "--backends", "mwms[implementation=gloo]"], {}, "error: --backends mwms[implementation=gloo]: "
                                                                   "'implementation=gloo' is not a value"),
    (K8S, [*IMAGE, "--port", "0"], {}, "error: --port must be in [1, 65535], got 0"),
    (K8S, [*IMAGE, "--model", "alexnet"], {}, "error: unknown model 'alexnet'"),
    (K8S, [*IMAGE, "--backends", "ps", "--num_ps", "0"], {}, "error: argument --num_ps"),
    (K8S, [*IMAGE, "--kubernetes_version", "2"], {}, "error: --kubernetes_version '2': expected 1.MINOR.PATCH"),
    (K8S, [*IMAGE, "--backends", "ps", "--workers", "70000"], {}, "error: run ps-async-w70000-ps1: 70000 worker tasks, "
                                                                 "more than the 65536 a role takes"),
    (PROJECT, [*BW, "--model_name", "vgg16", "--straggler", "1"], {}, "error: --straggler expects RANK:FACTOR"),
    (PROJECT, [*BW, "--model_name", "vgg16", "--straggler", "1:0.5"], {}, "error: --straggler"),
    (PROJECT, [*BW, "--model_name", "vgg16", "--healthy", "{tmp}"], {}, "error: --healthy {tmp}: needs --from"),
    # ---- under mpirun: one line for the whole job (rank 1 stays quiet), mpirun passes exit 2 on
    (MPIRUN, ["--model", "alexnet"], {}, "error: unknown model 'alexnet'"),
    (MPIRUN, ["--learning_rate", "nan"], {}, "error: --learning_rate must be a finite number, got nan"),
]


@pytest.fixture
def files(tmp_path):
    (tmp_path / "empty").mkdir()
    mnist8 = tmp_path / "mnist8"
    mnist8.mkdir()
    rng = np.random.RandomState(0)
    for name, arr in (("train-images-idx3-ubyte", rng.randint(0, 255, (20, 8, 8))),
                      ("train-labels-idx1-ubyte", rng.randint(0, 10, 20)),
                      ("t10k-images-idx3-ubyte", rng.randint(0, 255, (5, 8, 8))),
                      ("t10k-labels-idx1-ubyte", rng.randint(0, 10, 5))):
        write_idx(str(mnist8 / name), arr)
    (tmp_path / "binary").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "inventory").write_text("a slots=4\n")
    (tmp_path / "badslots").write_text("a slots=two\n")
    (tmp_path / "maxslots").write_text("a slots=4 max_slots=1\n")
    (tmp_path / "twoslots").write_text("a slots=2 slots=8\n")
    (tmp_path / "hugeslots").write_text("a slots=1000000000000\n")
    (tmp_path / "plug.py").write_text(PLUGINS)
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "hangs_on_import.py").write_text("import time\nwhile True:\n    time.sleep(1)\n")
    (tmp_path / "emptyidx" / "checkpoints").mkdir(parents=True)
    (tmp_path / "emptyidx" / "checkpoints" / "checkpoint").write_text("")
    (tmp_path / "emptyidx" / "launch.json").write_text('{"cpu_seconds": {}}')     # an earlier run's: kept
    rng = np.random.RandomState(1)
    mnist = dict(x_train=rng.randint(0, 255, (20, 28, 28)).astype(np.uint8), y_train=rng.randint(0, 10, 20),
                 x_test=rng.randint(0, 255, (5, 28, 28)).astype(np.uint8), y_test=rng.randint(0, 10, 5))
    variants = {"mnist_nan": dict(x_train=np.where(np.arange(20)[:, None, None] == 2, np.nan,
                                                   mnist["x_train"].astype(np.float64))),
                "mnist_float_labels": dict(y_train=mnist["y_train"].astype(np.float64)),
                "mnist_wrap": dict(y_train=np.full(20, 2 ** 32 + 1, dtype=np.int64))}
    for name, change in variants.items():
        (tmp_path / name).mkdir()
        np.savez(tmp_path / name / "mnist.npz", **{**mnist, **change})
    (tmp_path / "mnist_fifo").mkdir()
    for name in MNIST_FILES.values():
        write_idx(str(tmp_path / "mnist_fifo" / name), mnist["x_train" if "images" in name else "y_train"])
    os.remove(tmp_path / "mnist_fifo" / MNIST_FILES["x_train"])
    os.mkfifo(tmp_path / "mnist_fifo" / MNIST_FILES["x_train"])
    (tmp_path / "npz_fifo").mkdir()
    os.mkfifo(tmp_path / "npz_fifo" / "mnist.npz")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "fiforun").mkdir()
    os.mkfifo(tmp_path / "fiforun" / "metrics.jsonl")
    for name, header in (("hvd2run", dict(backend="horovod", mode="sync", world_size=2)),
                         ("ps1run", dict(backend="ps", mode="async", world_size=1, tasks={"ps": 1})),
                         ("otherdata", dict(backend="horovod", mode="sync", world_size=1,
                                            data_fingerprint="0" * 64))):
        (tmp_path / name / "checkpoints").mkdir(parents=True)
        (tmp_path / name / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-10"\n')
        (tmp_path / name / "config.json").write_text(Config(train_dir=str(tmp_path / name)).to_json())
        (tmp_path / name / "metrics.jsonl").write_text(json.dumps(dict(type="header", **header)) + "\n" +
                                                       json.dumps(dict(type="step", global_step=10, samples_seen=320, wall_time=1.0)) + "\n")
    (tmp_path / "linkrun").mkdir()
    os.symlink(tmp_path / "outside" / "target", tmp_path / "linkrun" / "metrics.jsonl")
    (tmp_path / "okrun").mkdir()
    (tmp_path / "okrun" / "metrics.jsonl").write_text(
        json.dumps(dict(type="header", backend="horovod", mode="sync", world_size=1)) + "\n" +
        json.dumps(dict(type="summary", status="ok", throughput={"median": 10.0})) + "\n")
    (tmp_path / "hangrun").mkdir()                # a recorded run whose model plug-in now hangs on import
    config = Config(train_dir=str(tmp_path / "hangrun")).to_dict()        # Config would import the plug-in
    config["model"] = str(tmp_path / "hangs_on_import.py") + ":build"
    (tmp_path / "hangrun" / "config.json").write_text(json.dumps(config))
    (tmp_path / "hangrun" / "metrics.jsonl").write_text(
        json.dumps(dict(type="header", backend="horovod", mode="sync", world_size=2)) + "\n" +
        json.dumps(dict(type="summary", status="ok", throughput={"median": 10.0},
                        breakdown={"step_s": 0.01, "compute_s": 0.008, "overhead_s": 0.002})) + "\n")
    (tmp_path / "reported").mkdir()
    (tmp_path / "reported" / "report.md").write_text("# an earlier report\n")
    (tmp_path / "np1.json").write_text(json.dumps({"np": 1, "results": [
        {"impl": "horovod", "bytes": b, "seconds": b / 1e9} for b in (1e3, 1e5, 1e7)]}))
    junk = tmp_path / "junkrun"
    junk.mkdir()
    (junk / "metrics.jsonl").write_bytes(b"\x00\xff garbage\n[1, 2, 3]\n{\"no\": \"type\"}\n"
                                         b"{\"type\": \"header\"}\n")
    return tmp_path


PLUGINS = """
import sys
import time
import numpy as np

def never_returns(cfg):
    while True:
        time.sleep(1)

def spins(cfg):
    while True:
        pass

def swallows_everything(cfg):
    while True:
        try:
            time.sleep(1)
        except Exception:
            pass

def int_logits(cfg, input_shape, num_classes):
    import tensorflow as tf
    inp = tf.keras.Input(input_shape)
    out = tf.keras.layers.Dense(num_classes)(tf.keras.layers.Flatten()(inp))
    return tf.keras.Model(inp, tf.keras.layers.Lambda(lambda t: tf.cast(t, tf.int32))(out))

def no_gradient(cfg, input_shape, num_classes):
    import tensorflow as tf
    inp = tf.keras.Input(input_shape)
    out = tf.keras.layers.Dense(num_classes)(tf.keras.layers.Flatten()(inp))
    return tf.keras.Model(inp, tf.keras.layers.Lambda(tf.stop_gradient)(out))

def fails_in_training(cfg, input_shape, num_classes):
    import tensorflow as tf
    class Net(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.flat, self.dense = tf.keras.layers.Flatten(), tf.keras.layers.Dense(num_classes)
        def call(self, x, training=False):
            if training:
                raise RuntimeError("dropout rate not set")
            return self.dense(self.flat(x))
    return Net()

def two_outputs(cfg, input_shape, num_classes):
    import tensorflow as tf
    inp = tf.keras.Input(input_shape)
    flat = tf.keras.layers.Flatten()(inp)
    return tf.keras.Model(inp, [tf.keras.layers.Dense(num_classes)(flat), tf.keras.layers.Dense(1)(flat)])

def batch_dependent(cfg, input_shape, num_classes):
    import tensorflow as tf
    class Net(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.flat, self.dense = tf.keras.layers.Flatten(), tf.keras.layers.Dense(num_classes)
        def call(self, x, training=False):
            return self.dense(self.flat(x))[:1]
    return Net()

def _data(x=None, y=None, x_test=None, y_test=None):
    rng = np.random.RandomState(0)
    return (rng.rand(10, 4) if x is None else x, np.arange(10) % 3 if y is None else y,
            rng.rand(6, 4) if x_test is None else x_test, np.arange(6) % 3 if y_test is None else y_test)

def overflow_data(cfg):
    x = np.random.RandomState(0).rand(10, 4)
    x[2, 1] = 1e300
    return _data(x=x)

def huge_view(cfg):
    x = np.broadcast_to(np.zeros((1, 4), np.float32), (10 ** 10, 4))     # a view: a few bytes until cast
    return _data(x=x, y=np.broadcast_to(np.zeros(1, np.int64), (10 ** 10,)))

def nan_data(cfg):
    x = np.random.RandomState(0).rand(10, 4)
    x[3, 1] = np.nan
    return _data(x=x)

def inf_test(cfg):
    x = np.random.RandomState(0).rand(6, 4)
    x[0, 0] = np.inf
    return _data(x_test=x)

wrapping_label = lambda cfg: _data(y=np.array([0] * 9 + [2 ** 32 + 1], dtype=np.int64))
huge_label = lambda cfg: _data(y=np.array([0] * 9 + [2 ** 31 - 1], dtype=np.int64))
negative_label = lambda cfg: _data(y=np.array([-1] + [2] * 9))
complex_data = lambda cfg: _data(x=np.ones((10, 4)) * (1 + 2j))
text_data = lambda cfg: _data(x=np.array([["a"] * 4] * 10))
no_columns = lambda cfg: _data(x=np.ones((10, 0)), x_test=np.ones((6, 0)))
float_labels = lambda cfg: _data(y=np.arange(10) / 3.0)
empty_train = lambda cfg: _data(x=np.ones((0, 4)), y=np.zeros(0, dtype=int))
short_labels = lambda cfg: _data(y=np.arange(9) % 3)
mixed_shapes = lambda cfg: _data(x_test=np.ones((6, 5)))
three_arrays = lambda cfg: _data()[:3]

def exits(cfg):
    sys.exit(0)

def raises(cfg):
    raise ValueError("no data here")

def no_weights(cfg, input_shape, num_classes):
    import tensorflow as tf
    inputs = tf.keras.Input(input_shape)
    return tf.keras.Model(inputs, tf.keras.layers.Flatten()(inputs)[:, :num_classes])

def model_exits(cfg, input_shape, num_classes):
    sys.exit(0)

def three_logits(cfg, input_shape, num_classes):
    import tensorflow as tf
    return tf.keras.Sequential([tf.keras.Input(input_shape), tf.keras.layers.Flatten(), tf.keras.layers.Dense(3)])

not_a_model = lambda cfg, input_shape, num_classes: {"layers": 2}
"""


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.parametrize("entry, args, extra_env, message", CASES,
                         ids=[f"{i}-{os.path.basename(c[0][-1])}-{' '.join(c[1])[:40]}" for i, c in enumerate(CASES)])
@pytest.mark.process
def test_bad_input(files, entry, args, extra_env, message):
    fill = lambda text: text.replace("{tmp}", str(files))
    argv = [*entry, *[fill(a) for a in args]]
    if entry not in (COMPARE, PROJECT, HOSTS, TUNE) and "--train_dir" not in args:
        argv += ["--train_dir", str(files / "run")]
    before = snapshot(files)
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                         env=env(**extra_env), start_new_session=True)
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail(f"no answer within 30 s: {argv}")
    took = time.monotonic() - t0
    deadline = time.monotonic() + 5             # whatever it started must be gone with it
    while _group_alive(p.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    leftover = _group_alive(p.pid)
    if leftover:
        os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 2, (p.returncode, out[-2000:], err[-2000:])
    errors = [line for line in (out + err).splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(fill(message)), err[-3000:]
    assert "Traceback" not in out + err
    assert took < 30 and not leftover
    assert snapshot(files) == before, "a refused command changed or created files"


MODEL_PLUGINS = [
    ("int_logits", "the model outputs int32 logits"),
    ("no_gradient", "no gradient reaches the model's weights"),
    ("fails_in_training", "the model fails in training mode: RuntimeError: dropout"),
    ("batch_dependent", "the model outputs shape (1, 10) for a batch of 2"),
    ("two_outputs", "the model returns 2 outputs; expected one tensor of logits"),
    ("no_weights", "the model has no trainable weights"),
    ("model_exits", "the plug-in called sys.exit(0)"),
    ("three_logits", "the model outputs shape (1, 3) for one example; expected (1, 10) logits"),
    ("not_a_model", "returned dict"),
]


@pytest.mark.unit
@pytest.mark.parametrize("name, message", MODEL_PLUGINS)
def test_a_model_plugin_that_cannot_train_is_refused_before_training(files, name, message):
    """Every entry point builds a plug-in's model through one check (common.spec.plugins.build_model,
    with its training step on a batch of 2 where the loop is eager) before any process joins a job.
    Each way a model can be wrong is that check's one UsageError; the table above runs it through a
    real process once per entry point (the trainers, both launchers, compare)."""
    from common.base.errors import UsageError
    from common.model.models import build_model
    from common.spec.config import make_config
    spec = f"{files}/plug.py:{name}"
    with pytest.raises(UsageError) as caught:
        build_model(make_config(model=spec))
    text = f"error: {caught.value}"
    assert "\n" not in text and text.startswith(f"error: --model {spec}: {message}"), text


@pytest.mark.process
def test_help_works():
    for entry in (HVD, PS, LAUNCH, COMPARE, PROJECT, HOSTS):
        r = run([*entry, "--help"], timeout=60)
        assert r.returncode == 0 and "usage:" in r.stdout, (entry, r.stderr)
    for entry in (HVD, PS, LAUNCH, COMPARE):
        r = run([*entry, "--help"], timeout=60)
        assert "--batch_size" in r.stdout and "--train_dir" in r.stdout


@pytest.mark.parametrize("text, code, out", [
    ("a slots=2\nb slots=2\n", 0, "horovodrun -np 4 -H a:2,b:2"),
    ("a slots=two\n", 2, "error: {f}:1: slots must be a positive integer, got 'two'"),
])
def test_hosts_command(tmp_path, text, code, out):
    f = tmp_path / "inv"
    f.write_text(text)
    r = run([*HOSTS, str(f)], timeout=30)
    assert r.returncode == code, r.stderr
    assert out.format(f=f) in (r.stdout + r.stderr)


# ---------------------------------------------------------------- the one command: hvdps SUBCOMMAND
def _hvdps(argv):
    """``hvdps ARGV`` in-process: (exit code, stdout, stderr)."""
    import contextlib
    import io
    from hvdps import cli
    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv) or 0
        except SystemExit as exc:
            code = exc.code
        finally:
            sys.argv = saved
    return code, out.getvalue(), err.getvalue()


def test_hvdps_help_lists_every_subcommand_and_method_package():
    code, out, _ = _hvdps(["--help"])
    assert code == 0
    for sub in ("compare", "project", "emulate", "hosts", "train " + VALID_BACKENDS.replace(", ", "|"), "launch " + VALID_BACKENDS.replace(", ", "|")):
        assert f"\n  {sub} " in out, out


@pytest.mark.parametrize("group", ["train", "launch"])
def test_hvdps_train_and_launch_help_list_every_method(group):
    code, out, err = _hvdps([group, "--help"])
    assert code == 0 and not err, err
    assert f"usage: hvdps {group} METHOD" in out and f"METHOD is one of: {VALID_BACKENDS}" in out


@pytest.mark.parametrize("argv, message", [
    ([], "error: a subcommand is needed (valid: compare, tune, project, emulate, hosts, data, k8s, train, launch)"),
    (["comapre"], "error: unknown subcommand 'comapre' (valid: compare, tune, project, emulate, hosts, data, k8s, train, launch)"),
    (["train"], f"error: hvdps train: unknown method none (valid: {VALID_BACKENDS})"),
    (["train", "mxnet"], f"error: hvdps train: unknown method 'mxnet' (valid: {VALID_BACKENDS})"),
    (["launch", "horovod:sync"], f"error: hvdps launch: unknown method 'horovod:sync' (valid: {VALID_BACKENDS})"),
    (["launch", "mpi", "--num_workers", "0"], "error: --num_workers must be in [1, 1024], got 0"),
    # the trainer's own refusals before mpirun starts a rank (its banner would follow the line)
    (["launch", "mpi", "--batch_size", "-4"], "error: --batch_size must be positive, got -4"),
    (["launch", "horovod", "--model", "nope"], "error: unknown model 'nope'"),
    (["launch", "horovod", "--hosts", "h1:2"], "error: hvdps launch horovod starts its ranks on this machine"),
    (["train", "horovod", "--batch_size", "-4"], "error: --batch_size must be positive"),
    (["train", "horovod", "--batch-size", "0"], "error: --batch_size must be positive"),    # the other spelling
    (["launch", "ps", "--num-workers", "0"], "error: --num_ps and --num_workers must be at least 1"),
    (["project", "--bandwidth-gbps", "-3"], "error: --bandwidth_gbps must be in [1e-06, 1e+06], got -3.0"),
    (["compare", "--dry-run", "--workers", "0"], "error: --workers"),
])
def test_hvdps_bad_input_is_one_line(argv, message):
    code, _, err = _hvdps(argv)
    lines = [l for l in err.splitlines() if l.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith(message), (code, err)


@pytest.mark.parametrize("argv", [
    ["--dry-run", "--no-progress", "--network-interface", "lo"],
    ["--dry_run", "--no_progress", "--network_interface", "lo"],
    ["--dry-run=", "--no-progress"],
])
def test_hyphen_and_underscore_spell_the_same_flag(argv):
    from hvdps.commands.compare import make_parser
    parser = make_parser()
    assert parser.spelled(argv)[0].startswith("--dry_run")
    if "lo" in argv:
        args = parser.parse_args(["--workers", "2", *argv])
        assert (args.dry_run, args.progress, args.network_interface) == (True, False, "lo")


def test_spelling_leaves_values_and_another_programs_flags_alone():
    from hvdps.commands.compare import make_parser
    parser = make_parser()
    argv = ["--rsh", "ssh -o x", "--not-ours", "--dry-run", "--", "--dry-run", "--network-interface"]
    assert parser.spelled(argv) == ["--rsh", "ssh -o x", "--not-ours", "--dry_run", "--", "--dry-run",
                                    "--network-interface"]


def test_hvdps_compare_dry_run_is_the_console_scripts(tmp_path):
    """``hvdps compare`` is hvdps.commands.compare's own main: the same lines, whichever spelling."""
    flags = ["--workers", "1,2", "--backends", "horovod,ps:sync", "--batch_size", "16", "--out", str(tmp_path / "c")]
    code, a, _ = _hvdps(["compare", "--dry-run", *flags])
    assert code == 0
    code, b, _ = _hvdps(["compare", "--dry_run", *flags])
    assert code == 0 and a == b and "ps_train.launch --num_ps 1 --num_workers 2 --sync" in a


def _recorded_run(folder, backend="horovod"):
    """A small recorded run, as a trainer writes it (common.trainer.metrics.MetricsWriter), with a breakdown."""
    from common.spec.config import make_config
    from common.trainer.metrics import MetricsWriter, throughput_stats
    from common.spec.plan import make_plan
    w = MetricsWriter(str(folder))
    cfg = make_config()
    w.header(cfg, backend, "sync", 2, {"ps": 1} if backend == "ps" else {}, make_plan(cfg, 1000, 2, 2))
    w.step(10, 640, 0.5, 100.0)
    w.eval(1, 10, 0.3, 0.95, target=0.9)
    w.summary("ok", 10, 1280, throughput_stats([100, 110, 90]), 0.3, 0.95, 1000,
              breakdown={"step_s": 0.02, "compute_s": 0.01, "overhead_s": 0.01, "overhead_share": 0.5},
              gradient={"dense_bytes": 1000, "sparse_bytes": 0, "sparse_table_bytes": 0})
    w.close()
    return folder / "metrics.jsonl"


@pytest.mark.parametrize("record, field, value, refused", [
    ("summary", "breakdown", {"step_s": 0.02, "compute_s": True}, "compute_s"),   # was projected as 1,000 ms
    ("summary", "breakdown", {"step_s": 0.02, "compute_s": 0.01, "exchange_s": [1, 2]}, "exchange_s"),
    ("summary", "throughput", {"median": "100"}, "throughput.median"),
    ("summary", "gradient", {"dense_bytes": "1000"}, "gradient.dense_bytes"),
    ("step@ps", "sync_wait_total_s", ["1", "2"], "sync_wait_total_s[0]"),   # a method's own field (Method.records)
    ("summary@ps", "dropped_gradients", -1, "dropped_gradients"),
    ("step", "sync_wait_total_s", ["1", "2"], None),                  # ... in another method's run: kept as written
    ("step", "loss", None, None),                                        # a step without its loss: taken
    ("eval", "accuracy", None, None),                                    # an evaluation without one: taken
    ("step", "samples_seen", None, "samples_seen"),                      # what every trainer writes: refused
    ("step", "wall_time", None, "wall_time"),
    ("eval", "wall_time", None, "wall_time"),
    ("header", "mode", None, "mode"),                                    # a run no table can place
    ("header", "world_size", None, "world_size"),
    ("header", "versions", "2.21", "versions"),
    ("header@ps", "ps_shard_bytes", {"ps:0": None}, "ps_shard_bytes.ps:0"),
    ("header", "config", {"target_accuracy": "0.9"}, "config.target_accuracy"),
    ("summary", "breakdown", {"step_s": 0.02, "compute_s": 0.01}, "come together"),   # no overhead: no split
    ("summary", "breakdown", {"step_s": 0.0, "compute_s": 0.0, "overhead_s": 0.0}, "step_s"),
])
@pytest.mark.parametrize("command", [["compare"], ["project", "--bandwidth_gbps", "25", "--latency_us", "10"]])
def test_a_crafted_record_is_one_line_or_taken_never_a_traceback(tmp_path, record, field, value, refused, command):
    """Recorded runs read back by ``--from``: a wrong-typed field is refused by the reader in one line,
    a missing optional one is taken (the report and the projection handle its absence)."""
    record, _, backend = record.partition("@")
    path = _recorded_run(tmp_path / "run", backend or "horovod")
    lines = [json.loads(l) for l in path.read_text().splitlines()]
    for r in lines:
        if r["type"] == record:
            r.pop(field, None) if value is None else r.__setitem__(field, value)
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    code, _, err = _hvdps([*command, "--from", str(tmp_path / "run"), "--out", str(tmp_path / "out")])
    errors = [l for l in err.splitlines() if l.startswith("error:")]
    assert "Traceback" not in err, err
    refused = refused.get(command[0]) if isinstance(refused, dict) else refused
    if refused is None:
        assert code == 0 and not errors, err
    else:
        assert code == 2 and len(errors) == 1 and refused in errors[0], err
