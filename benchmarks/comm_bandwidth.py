"""Gradient-exchange cost: Horovod allreduce (MPI, Gloo) vs raw MPI vs PS push/pull.

    python benchmarks/comm_bandwidth.py [--np 2] [--sizes_mb 1,10,100] [--repeats 10]

One invocation runs every measurement back to back on the same machine and
writes benchmarks/results/comm.json plus a markdown table:

- mpi4py ``Allreduce`` (raw MPI) and ``hvd.allreduce`` with the MPI controller
  in the *same* mpirun job, so both see identical conditions;
- ``hvd.allreduce`` under ``horovodrun --gloo``;
- Horovod again with tuning (fusion threshold, cycle time) given by --tuned_env;
- TensorFlow's own all-reduce: --np MultiWorkerMirroredStrategy tasks on loopback, each told
  the cluster by TF_CONFIG, timing the strategy's ``all_reduce`` (``RING``, gRPC): the measurement
  hvdps project fits TensorFlow's ring from (``mwms``);
- PS push (worker -> PS ``assign_add``) and pull (PS -> worker read) over
  TensorFlow's gRPC runtime, 1 worker and 1 PS task, on the same sizes.

Sizes: the models' gradient sizes plus --sizes_mb. Times are medians over
--repeats after --warmup untimed rounds. Bandwidth = bytes / time (algorithm
bandwidth: what the trainer experiences, not bus bandwidth).
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
from common.base.errors import cli  # noqa: E402
from common.base.flags import Parser, megabytes  # noqa: E402

def gradient_sizes():
    from common.spec.config import make_config
    from common.model.models import build_model, gradient_bytes
    out = {}
    for name, kw in (("mlp/digits", dict(model="mlp")), ("cnn/digits", dict(model="cnn")),
                     ("mlp/mnist-shape", dict(model="mlp", dataset="synthetic", image_shape=(28, 28, 1))),
                     ("resnet50/224", dict(model="resnet50", dataset="synthetic", image_shape=(224, 224, 3),
                                           num_classes=1000))):
        out[name] = gradient_bytes(build_model(make_config(**kw)))
    return out


def timeit(fn, repeats, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ---------------------------------------------------------------- inside the jobs
def worker_allreduce(args):
    """Runs on every rank. Rank 0 prints one JSON line per measurement."""
    import numpy as np
    if args.impl.split(":")[0] == "mpi4py":
        return worker_mpi4py(args, np)
    import tensorflow as tf
    import horovod.tensorflow as hvd
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    raw = None
    if args.with_mpi4py:
        from mpi4py import MPI
        raw = MPI.COMM_WORLD
    sizes = json.loads(args.sizes_json)
    for label, nbytes in sizes:
        n = max(1, nbytes // 4)
        x = tf.random.uniform([n], dtype=tf.float32)
        counter = [0]

        def hvd_op():
            counter[0] += 1
            hvd.allreduce(x, op=hvd.Sum, name=f"bw.{label}.{counter[0] % 4}").numpy()

        t_hvd = timeit(hvd_op, args.repeats, args.warmup)
        rec = {"label": label, "bytes": n * 4, "impl": f"horovod-{args.impl}", "seconds": t_hvd}
        if hvd.rank() == 0:
            print("RESULT " + json.dumps(rec), flush=True)
        if raw is not None:
            a = np.random.rand(n).astype(np.float32)
            b = np.empty_like(a)
            from mpi4py import MPI

            def mpi_op():
                raw.Allreduce(a, b, op=MPI.SUM)

            raw.Barrier()
            t_mpi = timeit(mpi_op, args.repeats, args.warmup)
            if hvd.rank() == 0:
                print("RESULT " + json.dumps({"label": label, "bytes": n * 4, "impl": "mpi4py-beside-horovod",
                                              "seconds": t_mpi}), flush=True)
    hvd.allreduce(tf.constant(0.0), name="bw.done").numpy()   # rank 0 has printed everything
    sys.stdout.flush()
    # Skip MPI finalisation: with mpi4py in the same process it segfaults; mpirun
    # then reports an 'improper exit', which run_job tolerates once results are in.
    os._exit(0)


MPI4PY_OPTIONS = {"multiple", "thread", "inplace", "cycle", "slowcycle", "dup", "small", "bigfirst"}


def worker_mpi4py(args, np):
    """Raw MPI with nothing else in the process: the bandwidth ceiling on this machine.

    ``--impl mpi4py:<option>+<option>`` adds, one at a time, what a Horovod process does
    differently around the same ``MPI_Allreduce``, to tell which of them costs: ``multiple``
    initialises MPI at MPI_THREAD_MULTIPLE (Horovod's level); ``thread`` calls Allreduce from a
    second thread, as Horovod's background thread does; ``inplace`` reduces in place
    (MPI_IN_PLACE, as Horovod does on its output buffer); ``cycle`` keeps a second thread doing
    what Horovod's background loop does between collectives: a small Allreduce on a duplicate
    communicator every millisecond (its cache coordination; ``slowcycle``: every 50 ms);
    ``dup`` reduces on a duplicate of COMM_WORLD, as Horovod does on its own; ``small`` and
    ``bigfirst`` send a small or a 16 MiB Allreduce on COMM_WORLD before anything else, which
    decides how the ranks' TCP connections are first opened."""
    import threading
    opts = set(args.impl.partition(":")[2].split("+")) - {""}
    if opts - MPI4PY_OPTIONS:
        raise SystemExit(f"error: --impl {args.impl}: choose options from {', '.join(sorted(MPI4PY_OPTIONS))}")
    import mpi4py
    if "multiple" in opts:
        mpi4py.rc.thread_level = "multiple"
    from mpi4py import MPI
    if "bigfirst" in opts:      # a large message on COMM_WORLD before anything else
        big = np.ones(1 << 22, np.float32)
        MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, big, op=MPI.SUM)
    if "small" in opts:         # a small collective on COMM_WORLD first (no duplicate)
        one = np.ones(4, np.int64)
        MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, one, op=MPI.SUM)
    comm = MPI.COMM_WORLD.Dup() if "dup" in opts else MPI.COMM_WORLD
    stop = threading.Event()
    pause = 0.05 if "slowcycle" in opts else 0.001
    if opts & {"cycle", "slowcycle"}:
        side = comm.Dup()
        bits = np.zeros(4, np.int64)
        out = np.empty_like(bits)

        def cycle():
            while not stop.is_set():
                side.Allreduce(bits, out, op=MPI.BOR)
                time.sleep(pause)
        threading.Thread(target=cycle, daemon=True).start()
    for label, nbytes in json.loads(args.sizes_json):
        a = np.random.rand(max(1, nbytes // 4)).astype(np.float32)
        b = np.empty_like(a)

        def op():
            if "inplace" in opts:
                comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
            else:
                comm.Allreduce(a, b, op=MPI.SUM)
        if "thread" in opts:
            plain = op

            def op():
                t = threading.Thread(target=plain)
                t.start()
                t.join()
        comm.Barrier()
        t = timeit(op, args.repeats, args.warmup)
        if comm.rank == 0:
            print("RESULT " + json.dumps({"label": label, "bytes": a.nbytes, "impl": args.impl, "seconds": t}),
                  flush=True)
    if opts & {"cycle", "slowcycle"}:     # the side loop's collectives must not outlive the other rank's
        stop.set()
        os._exit(0)


# One TensorFlow PS task (gRPC server) for the cluster given as JSON in argv[1]; serves until killed.
PS_TASK = ("import json, sys, time, tensorflow as tf;"
           "s = tf.distribute.Server(tf.train.ClusterSpec(json.loads(sys.argv[1])), job_name='ps', task_index=0);"
           "print('ready', flush=True); time.sleep(3600)")


def worker_ps(args):
    """One PS task in a child process, this process as the worker; push and pull per size."""
    import tensorflow as tf
    from common.base.procs import free_ports
    tf.compat.v1.disable_eager_execution()
    child = None
    if args.cluster_json:                  # across hosts: the PS task was started on its own host
        cluster = json.loads(args.cluster_json)
    else:
        ps_port, w_port = free_ports(2)
        cluster = {"ps": [f"127.0.0.1:{ps_port}"], "worker": [f"127.0.0.1:{w_port}"]}
        child = subprocess.Popen([sys.executable, "-c", PS_TASK, json.dumps(cluster)],
                                 env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    try:
        server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name="worker", task_index=0)
        for label, nbytes in json.loads(args.sizes_json):
            n = max(1, nbytes // 4)
            g = tf.Graph()
            with g.as_default():
                with tf.device("/job:ps/task:0"):
                    var = tf.compat.v1.get_variable("v", [n], tf.float32, tf.compat.v1.zeros_initializer())
                with tf.device("/job:worker/task:0"):
                    grad = tf.compat.v1.get_variable("g", [n], tf.float32, tf.compat.v1.ones_initializer(),
                                                     collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])
                    pulled = tf.reduce_sum(tf.identity(var))   # forces the bytes onto the worker
                with tf.device("/job:ps/task:0"):
                    push = var.assign_add(grad.read_value()).op
                init = [tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()]
            cfg = tf.compat.v1.ConfigProto(device_filters=["/job:ps", "/job:worker/task:0"])
            with tf.compat.v1.Session(server.target, graph=g, config=cfg) as sess:
                sess.run(init)
                for impl, op in (("ps-push", push), ("ps-pull", pulled)):
                    t = timeit(lambda: sess.run(op), args.repeats, args.warmup)
                    print("RESULT " + json.dumps({"label": label, "bytes": n * 4, "impl": impl, "seconds": t}),
                          flush=True)
    finally:
        if child is not None:
            child.kill()
            child.wait()
    os._exit(0)


# One MultiWorkerMirroredStrategy task (TF_CONFIG in its environment): the strategy's all_reduce of
# each size, timed; task 0 prints the medians.
MWMS_TASK = """
import json, os, statistics, sys, time
import tensorflow as tf
impl = tf.distribute.experimental.CommunicationImplementation.RING
strategy = tf.distribute.MultiWorkerMirroredStrategy(
    communication_options=tf.distribute.experimental.CommunicationOptions(implementation=impl))
task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
sizes, repeats, warmup = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
for label, nbytes in sizes:
    x = tf.ones([nbytes // 4], tf.float32)
    step = tf.function(lambda: strategy.run(
        lambda: tf.distribute.get_replica_context().all_reduce("sum", tf.identity(x))))
    times = []
    for i in range(warmup + repeats):
        t = time.perf_counter()
        float(strategy.experimental_local_results(step())[0][0])
        if i >= warmup:
            times.append(time.perf_counter() - t)
    if task == 0:
        print("RESULT " + json.dumps({"label": label, "bytes": nbytes, "impl": "mwms",
                                      "seconds": statistics.median(times)}), flush=True)
"""


def run_mwms(np_, sizes, repeats, warmup, timeout=1200):
    """``np_`` MultiWorkerMirroredStrategy tasks on loopback ports (the bind shim keeps their gRPC
    servers there); task 0's RESULT lines."""
    from common.base.procs import child_env, free_ports, loopback_only_env
    spec = {"worker": [f"127.0.0.1:{p}" for p in free_ports(np_)]}
    procs = []
    try:
        for i in range(np_):
            env = child_env(**loopback_only_env(),
                            TF_CONFIG=json.dumps({"cluster": spec, "task": {"type": "worker", "index": i}}))
            procs.append(subprocess.Popen([sys.executable, "-c", MWMS_TASK, json.dumps(sizes), str(repeats),
                                           str(warmup)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          env=env, cwd=REPO, start_new_session=True))
        out, err = procs[0].communicate(timeout=timeout)
        results = [json.loads(l.split("RESULT ", 1)[1]) for l in out.splitlines() if "RESULT " in l]
        if not results:
            print(f"FAILED ({procs[0].returncode}): MultiWorkerMirroredStrategy tasks\n{err[-2000:]}", file=sys.stderr)
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()


# ---------------------------------------------------------------- driver
def run_job(argv, env, timeout=1200):
    p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)
    # horovodrun prefixes lines with "[rank]<stdout>:"
    results = [json.loads(l.split("RESULT ", 1)[1]) for l in p.stdout.splitlines() if "RESULT " in l]
    if p.returncode != 0 and not results:
        print(f"FAILED ({p.returncode}): {shlex.join(argv)}\n{p.stderr[-2000:]}", file=sys.stderr)
    return results


@cli
def main():
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--sizes_mb", type=megabytes, default=megabytes("1,10,100"))
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--tuned_env", default="HOROVOD_CYCLE_TIME=0 TF_CPU_ALLOCATOR_USE_BFC=true",
                    help="environment for the 'tuned' Horovod rows")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "comm.json"))
    ap.add_argument("--worker", choices=("allreduce", "ps"), help=argparse.SUPPRESS)
    ap.add_argument("--impl", default="mpi", help=argparse.SUPPRESS)
    ap.add_argument("--with_mpi4py", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sizes_json", help=argparse.SUPPRESS)
    ap.add_argument("--cluster_json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker == "allreduce":
        return worker_allreduce(args)
    if args.worker == "ps":
        return worker_ps(args)

    sizes = sorted(gradient_sizes().items(), key=lambda kv: kv[1])
    sizes += args.sizes_mb
    common = ["--sizes_json", json.dumps(sizes), "--repeats", str(args.repeats), "--warmup", str(args.warmup)]
    from common.base.procs import child_env
    env = child_env()
    bindir = os.path.dirname(sys.executable)
    me = [sys.executable, os.path.abspath(__file__)]
    mpirun = ["mpirun", "-np", str(args.np), "-bind-to", "none", "--mca", "btl", "self,vader,tcp",
              "-x", "PATH", "-x", "PYTHONPATH", "-x", "TF_CPP_MIN_LOG_LEVEL"]
    tuned = dict(kv.split("=", 1) for kv in args.tuned_env.split())
    results = []
    results += run_job(mpirun + me + ["--worker", "allreduce", "--impl", "mpi4py"] + common, env)
    results += run_job(mpirun + ["-x", "HOROVOD_CPU_OPERATIONS=mpi"] + me +
                       ["--worker", "allreduce", "--impl", "mpi", "--with_mpi4py"] + common, env)
    tuned_x = [x for k, v in tuned.items() for x in ("-x", f"{k}={v}")]
    results += run_job(mpirun + ["-x", "HOROVOD_CPU_OPERATIONS=mpi"] + tuned_x + me +
                       ["--worker", "allreduce", "--impl", "mpi-tuned"] + common, env)
    results += run_job([os.path.join(bindir, "horovodrun"), "--gloo", "-np", str(args.np), "-H",
                        f"localhost:{args.np}"] + me + ["--worker", "allreduce", "--impl", "gloo"] + common, env)
    results += run_job([os.path.join(bindir, "horovodrun"), "--gloo", "-np", str(args.np), "-H",
                        f"localhost:{args.np}"] + me + ["--worker", "allreduce", "--impl", "gloo-tuned"] + common,
                       dict(env, **tuned))
    results += run_mwms(args.np, sizes, args.repeats, args.warmup)
    results += run_job(me + ["--worker", "ps"] + common, env)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"np": args.np, "repeats": args.repeats, "tuned_env": args.tuned_env,
                   "command": shlex.join([os.path.relpath(sys.executable, REPO)] + sys.argv),
                   "results": results}, f, indent=2)
    print(table(results))


def table(results):
    impls = []
    for r in results:
        if r["impl"] not in impls:
            impls.append(r["impl"])
    labels = []
    for r in results:
        if (r["label"], r["bytes"]) not in labels:
            labels.append((r["label"], r["bytes"]))
    by = {(r["label"], r["impl"]): r["seconds"] for r in results}
    lines = ["| size | bytes | " + " | ".join(impls) + " | best Horovod bandwidth / raw MPI |",
             "|---|---|" + "---|" * len(impls) + "---|"]
    for label, nbytes in labels:
        cells = []
        for impl in impls:
            t = by.get((label, impl))
            cells.append(f"{t * 1e3:.2f} ms ({nbytes / t / 1e9:.2f} GB/s)" if t else "-")
        mpi = by.get((label, "mpi4py"))
        hv = [by[(label, i)] for i in impls if i.startswith("horovod") and (label, i) in by]
        ratio = f"{mpi / min(hv):.2f}x" if mpi and hv else "-"
        lines.append(f"| {label} | {nbytes:,} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
