"""The Horovod trainer against a bare Horovod loop (the style of Horovod's synthetic benchmark).

    python benchmarks/bare_horovod.py [--repeats 3] [--np 2] [--steps 40]

The bare loop is written here once, outside hvdps, the way Horovod's
``tensorflow2_synthetic_benchmark.py`` is: a Keras application with
``weights=None``, one random batch made once and fed every step, plain SGD,
``hvd.DistributedGradientTape`` in a ``tf.function``, the variables broadcast
after the first step, and nothing else (no input pipeline, no metrics, no
checkpoints, no evaluation). ``horovod_train/main.py`` runs the same model,
batch, optimizer and thread split on synthetic data of the same shape.
Both are started by the same ``mpirun`` line and measured the same way:
samples/sec over intervals of ``--interval`` steps after ``--warmup`` steps,
median over intervals. Runs alternate (bare, trainer, bare, ...); the figure
is the median of the pairwise ratios. Start-up (launch to the first measured
interval) and teardown (last step to exit) are recorded apart.

Result: results/bare_horovod.json with the exact commands.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from common.base.errors import cli  # noqa: E402
from common.base.flags import Parser  # noqa: E402
from results_file import save  # noqa: E402
from common.formats.schemas import read_result  # noqa: E402


def bare_worker(args):
    """One rank of the bare loop; rank 0 writes its interval timings to ``args.result``."""
    import tensorflow as tf
    import horovod.tensorflow as hvd
    # The same MPI setting the trainer uses (BENCHMARKS.md section 2); without it this loop measures
    # Open MPI spinning on the cores the ranks compute on, not Horovod.
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    hvd.init()
    threads = max(1, (os.cpu_count() or 1) // hvd.local_size())   # the trainer's CPU split (place_rank)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, threads)))
    shape = tuple(int(v) for v in args.image_shape.split(","))
    model = getattr(tf.keras.applications, args.app)(weights=None, input_shape=shape, classes=args.classes)
    opt = tf.keras.optimizers.legacy.SGD(args.lr)
    data = tf.random.uniform([args.batch_size, *shape])
    target = tf.random.uniform([args.batch_size, 1], minval=0, maxval=args.classes, dtype=tf.int64)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(first):
        with tf.GradientTape() as tape:
            loss = loss_fn(target, model(data, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables(), root_rank=0)
        return loss

    t_start = time.time()
    step(True)
    times = [time.time()]
    for _ in range(args.steps - 1):
        float(step(False))                        # the same per-step sync as the trainer's loss fetch
        times.append(time.time())
    if hvd.rank() == 0:
        with open(args.result, "w") as f:
            json.dump({"start": t_start, "times": times}, f)


def interval_rates(times, first_step, every, samples_per_step):
    """Samples/sec from the end of step ``first_step`` over every ``every`` steps, as the trainer's
    meter counts them (times[i] = end of step i + 1)."""
    out = []
    for a in range(first_step - 1, len(times) - every, every):
        out.append(samples_per_step * every / (times[a + every] - times[a]))
    return out


def launch(np_, argv):
    from common.base.procs import child_env
    from hvdps.methods import get_launcher
    launcher = get_launcher("horovod")
    cmd = launcher.command(np_, [])
    main_at = cmd.index(os.path.join(os.path.dirname(HERE), "horovod_train", "main.py"))
    cmd = cmd[:main_at - 1] + [sys.executable] + argv     # the same mpirun line, another program
    env = child_env()
    env.update(launcher.env())
    return cmd, env


def run(cmd, env, timeout):
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd[:12])} ... failed ({proc.returncode}):\n{proc.stdout[-2000:]}")
    return t0, time.time()


def run_bare(args, scratch, rep):
    result = os.path.join(scratch, f"bare-{rep}.json")
    argv = [os.path.abspath(__file__), "--worker", "--result", result, "--app", args.app,
            "--image_shape", args.image_shape, "--classes", str(args.classes), "--batch_size",
            str(args.batch_size), "--steps", str(args.steps), "--lr", str(args.lr)]
    cmd, env = launch(args.np, argv)
    t0, t1 = run(cmd, env, args.timeout)
    rec = read_result(result)
    times = rec["times"]
    rates = interval_rates(times, args.warmup, args.interval, args.np * args.batch_size)
    return {"samples_per_sec": statistics.median(rates), "startup_s": times[args.warmup - 1] - t0,
            "teardown_s": t1 - times[-1], "wall_s": t1 - t0, "command": " ".join(cmd)}


def run_trainer(args, scratch, rep):
    from common.trainer.metrics import read_metrics
    out = os.path.join(scratch, f"trainer-{rep}")
    model = {"ResNet50": "resnet50", "ResNet101": "resnet101", "InceptionV3": "inception_v3",
             "VGG16": "vgg16", "MobileNetV2": "mobilenet_v2"}[args.app]
    argv = [os.path.join(os.path.dirname(HERE), "horovod_train", "main.py"), "--model", model,
            "--dataset", "synthetic", "--image_shape", args.image_shape, "--num_classes", str(args.classes),
            "--synthetic_samples", str(args.np * args.batch_size * 4), "--batch_size", str(args.batch_size),
            "--optimizer", "sgd", "--learning_rate", str(args.lr), "--scale_lr", "false",
            "--train_steps", str(args.steps), "--log_every", str(args.interval),
            "--warmup_steps", str(args.warmup), "--eval_every_epoch", "false",
            "--checkpoint_every_epoch", "false", "--probe_steps", "0", "--train_dir", out]
    cmd, env = launch(args.np, argv)
    t0, t1 = run(cmd, env, args.timeout)
    recs = read_metrics(os.path.join(out, "metrics.jsonl"))
    header = next(r for r in recs if r.type == "header")
    steps = [r for r in recs if r.type == "step"]
    rates = [r.samples_per_sec for r in steps if r.samples_per_sec is not None]
    first = next(r for r in steps if r.samples_per_sec is not None)
    before = [r for r in steps if r.global_step < first.global_step]
    start_measured = header.start_time + (before[-1].wall_time if before else 0.0)
    return {"samples_per_sec": statistics.median(rates), "startup_s": start_measured - t0,
            "teardown_s": t1 - (header.start_time + steps[-1].wall_time), "wall_s": t1 - t0,
            "command": " ".join(cmd)}


@cli
def main():
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--app", default="ResNet50", help="a tf.keras.applications name")
    ap.add_argument("--image_shape", default="64,64,3")
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--batch_size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--interval", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "bare_horovod.json"))
    args = ap.parse_args()
    if args.worker:
        return bare_worker(args)
    if args.warmup % args.interval or args.steps <= args.warmup + args.interval:
        raise SystemExit("error: --warmup must be a multiple of --interval and --steps > --warmup + --interval")
    scratch = tempfile.mkdtemp(prefix="bare_horovod.")
    runs = {"bare": [], "trainer": []}
    try:
        for rep in range(args.repeats):
            for kind, fn in (("bare", run_bare), ("trainer", run_trainer)):
                r = fn(args, scratch, rep)
                runs[kind].append(r)
                print(f"rep {rep} {kind:>7}: {r['samples_per_sec']:8.2f} samples/s, start-up {r['startup_s']:.1f} s, "
                      f"teardown {r['teardown_s']:.1f} s, wall {r['wall_s']:.1f} s", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    ratios = [t["samples_per_sec"] / b["samples_per_sec"] for b, t in zip(runs["bare"], runs["trainer"])]
    med = lambda kind, k: statistics.median(r[k] for r in runs[kind])
    table = {"bare_samples_per_sec": med("bare", "samples_per_sec"),
             "trainer_samples_per_sec": med("trainer", "samples_per_sec"),
             "ratio_median": statistics.median(ratios), "ratios": ratios,
             "bare_startup_s": med("bare", "startup_s"), "trainer_startup_s": med("trainer", "startup_s"),
             "bare_teardown_s": med("bare", "teardown_s"), "trainer_teardown_s": med("trainer", "teardown_s")}
    print(f"bare Horovod {table['bare_samples_per_sec']:.2f}, trainer {table['trainer_samples_per_sec']:.2f} "
          f"samples/s: trainer/bare {table['ratio_median']:.2f}x (pairs {', '.join(f'{r:.2f}' for r in ratios)})")
    save(args.out, args, table=table, runs=runs)


if __name__ == "__main__":
    main()
