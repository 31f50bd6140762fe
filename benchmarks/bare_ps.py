"""The PS trainer against the classic program users write: what does hvdps cost per step?

    python benchmarks/bare_ps.py [--modes async,sync] [--updates 3000] [--repeats 10]
                                 [--impls hvdps,launch] [--workers 2] [--pin] [--order alternate]
                                 [--features data,session,...]

The baseline ("bare") is the classic between-graph program, written here from
Kubeflow's dist-mnist example (training-operator examples/tensorflow/dist-mnist
before its TF2 rewrite) as a user ports it to ``tf.compat.v1``: reference
variables under replica_device_setter, an MLP of 100 hidden units, a summed
softmax cross-entropy, Adam 0.01, SyncReplicasOptimizer with its chief queue
runner and init tokens in sync mode, a Supervisor's session, and a loop that
feeds NumPy batches (a fresh shuffle each epoch), fetches the train op and the
global step, prints one line per step and stops at the global step. It does
nothing else per step. Both sides run the same job on this machine: 1 PS, 2
workers on loopback, MLP 784-100-10 on the 28x28 digits (examples/digits28.py),
batch 100 per worker, Adam 0.01, the same number of updates, one process per
role (``hvdps``: ``python -m ps_train.main --job_name=...``); ``launch`` adds
ps_train through its local launcher as a third run, so the launcher's own
cost, if any, shows separately. ``--features`` adds ps_train's choices to the
classic program one at a time (its input pipeline, its session, resource
variables, ...), to find where a difference goes.

Throughput is measured the same way for both: the chief's global step over
time, samples/sec per interval of ``--log_every`` of its own steps after
``--warmup`` steps, the median over intervals. Start-up (launch to the first
measured interval) and teardown (the last step to every process gone) are
reported separately. Repeats alternate bare and hvdps runs so drift on this
noisy machine hits both. Two ratios: of the medians of the runs, and the
median of the pair ratios (each run against the bare run just before it)
with a 90% percentile-bootstrap interval, which says how far 2 shared cores'
run-to-run noise (10-20% per pair) lets that median move.
Results: benchmarks/results/bare_ps.json (or --out) and a markdown table.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
from common.base.errors import cli  # noqa: E402
from common.base.flags import Parser  # noqa: E402

BATCH, HIDDEN, LR = 100, 100, 0.01


class Batches:
    """The classic program's ``mnist.train.next_batch``: a fresh shuffle each epoch, then slices."""

    def __init__(self, x, y, seed):
        self.x, self.y, self.rng, self.pos = x, y, np.random.default_rng(seed), len(x)

    def next_batch(self, n):
        if self.pos + n > len(self.x):
            order = self.rng.permutation(len(self.x))
            self.x, self.y, self.pos = self.x[order], self.y[order], 0
        self.pos += n
        return self.x[self.pos - n:self.pos], self.y[self.pos - n:self.pos]


def classic_graph(tf, cluster, index, sync, feats, x_train, onehot, updates):
    """The classic program's graph for worker ``index``: its train op, global step, loss and feeds."""
    v1 = tf.compat.v1
    workers = cluster.num_tasks("worker")
    device = f"/job:worker/task:{index}/cpu:0"
    setter = v1.train.replica_device_setter(worker_device=device, ps_device="/job:ps/cpu:0", cluster=cluster)
    with v1.device(setter):
        kind = {"use_resource": "resource" in feats}   # the port's reference variables unless asked
        step = v1.Variable(0, name="global_step", trainable=False, **kind)
        if "session" in feats:            # where the session's StopAtStepHook looks for it
            v1.add_to_collection(v1.GraphKeys.GLOBAL_STEP, step)
        w1 = v1.Variable(v1.truncated_normal([784, HIDDEN], stddev=1.0 / 28), name="hid_w", **kind)
        b1 = v1.Variable(v1.zeros([HIDDEN]), name="hid_b", **kind)
        w2 = v1.Variable(v1.truncated_normal([HIDDEN, 10], stddev=1.0 / HIDDEN ** 0.5), name="sm_w", **kind)
        b2 = v1.Variable(v1.zeros([10]), name="sm_b", **kind)
        x = v1.placeholder(tf.float32, [None, 784])
        y_ = v1.placeholder(tf.float32, [None, 10])
        if "data" in feats:                   # ps_train's input pipeline (common/inputs/data.py), no feeds
            from common.spec.config import make_config
            from common.inputs.data import make_dataset
            cfg = make_config(model="mlp", batch_size=BATCH, train_steps=2 * updates, dataset="examples/digits28.py:load")
            x, labels = v1.data.make_one_shot_iterator(make_dataset(cfg, index, workers, num_steps=2 * updates)).get_next()
            x, y_ = tf.reshape(x, [-1, 784]), tf.one_hot(labels, 10)
        probs = tf.nn.softmax(v1.nn.xw_plus_b(tf.nn.relu(v1.nn.xw_plus_b(x, w1, b1)), w2, b2))
        loss = -tf.reduce_sum(y_ * v1.log(tf.clip_by_value(probs, 1e-10, 1.0)))
        opt = v1.train.AdamOptimizer(LR)
        if sync:
            opt = v1.train.SyncReplicasOptimizer(opt, replicas_to_aggregate=workers, total_num_replicas=workers,
                                                 name="mnist_sync_replicas")
        train_op = opt.minimize(loss, global_step=step)
        if "counter" in feats:                # ps_train's per-worker step counter on the PS
            with v1.device(step.device):
                counts = v1.Variable(tf.zeros([workers], tf.int64), trainable=False, name="counts", **kind)
                train_op = tf.group(train_op, v1.scatter_add(counts, [index], [1]))
    return types.SimpleNamespace(device_setter=setter, step=step, x=x, y=y_, loss=loss, opt=opt, train_op=train_op)


def bare_role(args):
    """One task of the classic program (run as a child process).

    Kubeflow's dist-mnist (training-operator examples/tensorflow/dist-mnist before
    its TF2 rewrite) as a user ports it to ``tf.compat.v1``: plain variables under
    replica_device_setter, an MLP of HIDDEN units, a softmax cross-entropy summed
    over the batch, Adam, SyncReplicasOptimizer for sync with its chief queue
    runner and init tokens, a Supervisor, and a loop that feeds NumPy batches
    with feed_dict, fetches the train op and the global step, prints one line
    per step and stops at the global step. ``--features`` adds one of ps_train's
    per-step choices at a time, to find what a difference costs.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from examples.digits28 import load
    v1 = tf.compat.v1
    feats = set(filter(None, (args.features or "").split(",")))
    if "resource" in feats:
        v1.disable_eager_execution()          # ps_train's setting: resource variables, TF2 control flow
    else:
        v1.disable_v2_behavior()              # the port's first line (TF's migration guide)
    tf.get_logger().setLevel("ERROR")
    cluster = tf.train.ClusterSpec(json.loads(args.cluster))
    server = tf.distribute.Server(cluster, job_name=args.role, task_index=args.index, protocol="grpc")
    if args.role == "ps":
        server.join()
        return
    workers = len(json.loads(args.cluster)["worker"])
    x_train, y_train, _, _ = load(None)
    x_train = x_train.reshape(len(x_train), -1).astype(np.float32)
    onehot = np.eye(10, dtype=np.float32)[y_train.astype(np.int64)]
    batches = Batches(x_train, onehot, seed=args.index)
    chief = args.index == 0
    g = classic_graph(tf, cluster, args.index, args.sync, feats, x_train, onehot, args.updates)
    with v1.device(g.device_setter):
        sv_args = {}
        if args.sync:
            sv_args = dict(local_init_op=g.opt.chief_init_op if chief else g.opt.local_step_init_op,
                           ready_for_local_init_op=g.opt.ready_for_local_init_op)
            # the classic program's tokens: R at the start (TF's default), so each worker may start its
            # next step before the update it waits for is applied; tokens0: none spare (ps_train's lock-step)
            tokens = g.opt.get_init_tokens_op(0 if "tokens0" in feats else -1)
            queue_runner = g.opt.get_chief_queue_runner()
        sv = None if "session" in feats else v1.train.Supervisor(is_chief=chief, logdir=tempfile.mkdtemp(prefix="bare_ps-"),
                                 init_op=v1.global_variables_initializer(), recovery_wait_secs=1,
                                 global_step=g.step, **sv_args)
    config = v1.ConfigProto(allow_soft_placement=True, device_filters=["/job:ps", f"/job:worker/task:{args.index}"])
    if "session" in feats:                # ps_train's session: MonitoredTrainingSession, StopAtStepHook
        hooks = [v1.train.StopAtStepHook(last_step=args.updates)]
        if args.sync:
            hooks.append(g.opt.make_session_run_hook(chief, num_tokens=0 if "tokens0" in feats else -1))
        if not chief:                     # as ps_train does: TF's own wait polls every 30 s
            with v1.Session(server.target, config=config) as s:
                while len(s.run(v1.report_uninitialized_variables(v1.global_variables()))):
                    time.sleep(0.2)
        sess = v1.train.MonitoredTrainingSession(master=server.target, is_chief=chief, hooks=hooks, config=config,
                                                 save_checkpoint_secs=None, save_summaries_steps=None,
                                                 save_summaries_secs=None, log_step_count_steps=0)
    else:
        sess = sv.prepare_or_wait_for_session(server.target, config=config)
        if args.sync and chief:
            sess.run(tokens)
            sv.start_queue_runners(sess, [queue_runner])
    fetches = [g.train_op, g.step] + ([g.loss] if "loss" in feats else [])
    opts = v1.RunOptions(timeout_in_ms=60000) if "timeout" in feats else None
    marks, n, first = [], 0, None
    while True:
        feed = None
        if "data" not in feats:
            bx, by = batches.next_batch(BATCH)
            feed = {g.x: bx, g.y: by}
        update = sess.run(fetches, feed_dict=feed, options=opts)[1]
        n += 1
        first = first or time.time()
        print(f"{time.time():f}: Worker {args.index}: training step {n} done (global step: {update})")
        if chief and n % args.log_every == 0:
            marks.append((time.perf_counter(), int(update)))
        if update >= args.updates or ("session" in feats and sess.should_stop()):
            break
    last = time.time()
    if chief:
        print("BARE " + json.dumps({"marks": marks, "end": last, "first_step": first}), flush=True)


def cpu_seconds(pid):
    """user + system CPU seconds of a live process (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def kill_all(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def start_roles(argvs, env, pin, capture=0):
    """Start ``[(role, argv)]`` (the PS first); with ``pin``, worker i on core i and the PS floating,
    as ``ps_train.launch --pin_workers`` does. The process at index ``capture`` gets pipes."""
    procs = []
    cores = os.cpu_count() or 1
    try:
        for n, (role, argv) in enumerate(argvs):
            worker = role.startswith("worker:")
            prefix = ["taskset", "-c", str(int(role.split(":")[1]) % cores)] if pin and worker else []
            pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) if n == capture else \
                dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(subprocess.Popen(prefix + argv, env=env, cwd=REPO, **pipes))
    except BaseException:
        kill_all(procs)
        raise
    return procs


def finish_roles(procs, chief, timeout, before_kill=None, first=0):
    """Wait for the chief, then (bounded) for procs[first:]; kill whatever is left. (stdout, stderr, code)."""
    try:
        out, err = procs[chief].communicate(timeout=timeout)
        for p in procs[first:]:   # async: the others stop at the last step too; sync: they wait for tokens
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if before_kill:
            before_kill()
        return out, err, procs[chief].returncode
    finally:
        kill_all(procs)


def local_cluster(workers):
    from common.base.procs import free_ports
    ports = free_ports(workers + 1)       # distinct: picked together
    return {"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{p}" for p in ports[1:]]}


def roles(cluster):
    return [("ps:0", 0)] + [(f"worker:{i}", i) for i in range(len(cluster["worker"]))]


def run_bare(mode, updates, warmup, log_every, timeout, features="", workers=2, pin=False):
    cluster = local_cluster(workers)
    base = [sys.executable, os.path.abspath(__file__), "--cluster", json.dumps(cluster), "--updates", str(updates),
            "--log_every", str(log_every), "--features", features] + (["--sync"] if mode == "sync" else [])
    argvs = [(role, base + ["--role", role.split(":")[0], "--index", str(i)]) for role, i in roles(cluster)]
    t0 = time.time()
    procs = start_roles(argvs, dict(os.environ, PYTHONPATH=REPO), pin, capture=1)
    ps_cpu = {}           # the bare PS never exits (server.join): its CPU is read before it is killed
    out, _, _ = finish_roles(procs, 1, timeout, lambda: ps_cpu.update(s=cpu_seconds(procs[0].pid)), first=1)
    t_end = time.time()
    line = next((x for x in out.splitlines() if x.startswith("BARE ")), None)
    if line is None:
        raise RuntimeError(f"bare {mode}: the chief printed no result")
    data = json.loads(line[5:])
    marks = data["marks"]
    samples_per_update = BATCH * (workers if mode == "sync" else 1)
    rates = [(g1 - g0) * samples_per_update / (t1 - t0_)
             for (t0_, g0), (t1, g1) in zip(marks, marks[1:]) if g0 >= warmup and t1 > t0_]
    return {"impl": "bare", "mode": mode, "samples_per_sec": statistics.median(rates), "intervals": len(rates),
            "wall_s": t_end - t0, "startup_s": data["first_step"] - t0, "teardown_s": t_end - data["end"],
            "train_s": data["end"] - data["first_step"], "ps_cpu_s": ps_cpu.get("s")}


def trainer_flags(mode, updates, warmup, log_every, out, workers):
    # --train_steps counts each worker's own steps; async applies one update per worker step, so the
    # same job as the bare loop's `updates` global steps is updates / workers steps per worker.
    steps = updates // workers if mode == "async" else updates
    flags = ["--model", "mlp", "--hidden_units", str(HIDDEN), "--optimizer", "adam", "--learning_rate", str(LR),
             "--scale_lr", "false", "--batch_size", str(BATCH), "--dataset", "examples/digits28.py:load",
             "--train_steps", str(steps), "--warmup_steps", str(warmup), "--log_every", str(log_every),
             "--eval_every_epoch", "false", "--checkpoint_every_epoch", "false", "--probe_steps", "0",
             "--train_dir", out]
    return flags + (["--sync"] if mode == "sync" else [])


def run_hvdps(mode, updates, warmup, log_every, timeout, out, workers=2, pin=False, launcher=False):
    """ps_train on the same job: one process per role like the bare loop, or through ps_train.launch."""
    from hvdps.measure.rows import load_run
    from common.base.procs import child_env
    flags = trainer_flags(mode, updates, warmup, log_every, out, workers)
    t0 = time.time()
    if launcher:
        cmd = [sys.executable, "-m", "ps_train.launch", "--num_ps", "1", "--num_workers", str(workers)]
        r = subprocess.run(cmd + (["--pin_workers"] if pin else []) + flags, cwd=REPO, env=child_env(),
                           capture_output=True, text=True, timeout=timeout)
        code, err = r.returncode, r.stdout + r.stderr
    else:
        cluster = local_cluster(workers)
        hosts = [f"--ps_hosts={','.join(cluster['ps'])}", f"--worker_hosts={','.join(cluster['worker'])}"]
        argvs = [(role, [sys.executable, "-m", "ps_train.main", f"--job_name={role.split(':')[0]}",
                         f"--task_index={i}", *hosts, *flags]) for role, i in roles(cluster)]
        _, err, code = finish_roles(start_roles(argvs, child_env(), pin, capture=1), 1, timeout)
    t_end = time.time()
    impl = "launch" if launcher else "hvdps"
    if code != 0:
        raise RuntimeError(f"{impl} {mode}: exit {code}: {err.strip().splitlines()[-1:]}")
    row = load_run(out)
    return {"impl": impl, "mode": mode, "samples_per_sec": row.samples_per_sec_median,
            "intervals": len([s for s in row.curves.steps if s.samples_per_sec]),
            "wall_s": t_end - t0, "teardown_s": None}


def pair_ratios(results, impl, mode):
    """Each run of ``impl`` against the bare run of the same repeat (they ran back to back)."""
    bare = {r["repeat"]: r["samples_per_sec"] for r in results if r["impl"] == "bare" and r["mode"] == mode}
    return [r["samples_per_sec"] / bare[r["repeat"]] for r in results
            if r["impl"] == impl and r["mode"] == mode and r["repeat"] in bare]


def bootstrap_median(values, level=0.90, draws=4000, seed=0):
    """(low, high): a percentile-bootstrap interval of the median; how far the pairs' noise lets
    the median ratio move. None with fewer than 3 values."""
    if len(values) < 3:
        return None
    import numpy as np
    rng = np.random.default_rng(seed)
    v = np.asarray(values)
    meds = np.median(v[rng.integers(0, len(v), (draws, len(v)))], axis=1)
    tail = (1 - level) / 2 * 100
    return float(np.percentile(meds, tail)), float(np.percentile(meds, 100 - tail))


def table(results, modes, impls):
    """Markdown rows: each mode's bare loop, then each implementation against it."""
    lines = ["| mode | run | samples/s (median of runs) | / bare (ratio of medians) | median of pair ratios "
             "[90% bootstrap] | pairs | wall s (median) |", "|---|---|---|---|---|---|---|"]
    for mode in modes:
        def med(impl, key):
            return statistics.median(r[key] for r in results if r["impl"] == impl and r["mode"] == mode)
        bare = med("bare", "samples_per_sec")
        lines.append(f"| {mode} | bare loop | {bare:,.0f} | | | | {med('bare', 'wall_s'):.1f} |")
        for impl in impls:
            pairs = pair_ratios(results, impl, mode)
            ci = bootstrap_median(pairs)
            ours = med(impl, "samples_per_sec")
            lines.append(f"| {mode} | {impl} | {ours:,.0f} | {ours / bare:.2f}x | {statistics.median(pairs):.2f}x"
                         + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "") + " | "
                         + ", ".join(f"{x:.2f}" for x in pairs) + f" | {med(impl, 'wall_s'):.1f} |")
    return lines


def pooled(paths):
    """The runs of earlier invocations together; a pair stays within its own invocation."""
    from common.base.errors import UsageError
    from common.formats.schemas import read_result
    results = []
    for k, path in enumerate(paths):
        try:
            runs = read_result(path)["results"]
        except (UsageError, KeyError, TypeError) as exc:
            raise ValueError(f"--pool {path}: not a bare_ps.py result file ({exc})")
        results += [dict(r, repeat=(k, r["repeat"])) for r in runs]
    modes = list(dict.fromkeys(r["mode"] for r in results))
    impls = list(dict.fromkeys(r["impl"] for r in results if r["impl"] != "bare"))
    return results, modes, impls


@cli
def main():
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--cluster", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--sync", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--features", default="", help="ps_train's choices to add to the classic program, one "
                    "comma-separated list, to find what a difference costs: data (ps_train's tf.data pipeline "
                    "instead of feeds), session (MonitoredTrainingSession with a StopAtStepHook instead of the "
                    "Supervisor's session), resource (resource variables instead of the port's reference "
                    "variables), counter (a per-worker step counter on the PS), loss (fetch the loss), timeout "
                    "(a RunOptions timeout), tokens0 (sync: no spare tokens, ps_train's lock-step, instead of TF's "
                    "default of R)")
    ap.add_argument("--modes", default="async,sync")
    ap.add_argument("--workers", type=int, default=2, help="worker tasks (1 PS either way)")
    ap.add_argument("--updates", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=100, help="updates excluded from throughput")
    ap.add_argument("--log_every", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--impls", default="hvdps", help="what runs against the bare loop, alternating with it: "
                    "hvdps (ps_train, one process per role like the bare loop), launch (ps_train through "
                    "python -m ps_train.launch)")
    ap.add_argument("--order", choices=("bare-first", "alternate"), default="bare-first",
                    help="within each repeat, the bare loop first (bare-first), or first in even repeats and "
                    "last in odd ones (alternate: a machine that slows down or speeds up over the invocation "
                    "counts against each side in turn)")
    ap.add_argument("--pin", action="store_true", help="worker i on core i, the PS floating (both sides)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "bare_ps.json"))
    ap.add_argument("--pool", nargs="+", default=None, metavar="RESULT_JSON",
                    help="run nothing: the table of earlier result files together")
    args = ap.parse_args()
    if args.role:
        return bare_role(args)
    if args.pool:
        try:
            print("\n".join(table(*pooled(args.pool))))
        except ValueError as exc:
            ap.error(str(exc))
        return 0
    for name in ("workers", "updates", "repeats", "log_every"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if set(args.modes.split(",")) - {"async", "sync"}:
        ap.error(f"--modes: choose from async, sync (got {args.modes!r})")
    impls = [i for i in args.impls.split(",") if i]
    if not impls or set(impls) - {"hvdps", "launch"}:
        ap.error(f"--impls: choose from hvdps, launch (got {args.impls!r})")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for mode in args.modes.split(","):
                order = ["bare"] + impls
                for impl in (order[::-1] if args.order == "alternate" and rep % 2 else order):
                    if impl == "bare":
                        res = run_bare(mode, args.updates, args.warmup, args.log_every, args.timeout, args.features,
                                       args.workers, args.pin)
                    else:
                        res = run_hvdps(mode, args.updates, args.warmup, args.log_every, args.timeout,
                                        os.path.join(tmp, f"{impl}-{mode}-{rep}"), args.workers, args.pin,
                                        launcher=impl == "launch")
                    res["repeat"] = rep
                    results.append(res)
                    print(json.dumps(res), flush=True)
    lines = table(results, args.modes.split(","), impls)
    print("\n".join(lines))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"command": " ".join(sys.argv), "results": results, "table": lines}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
