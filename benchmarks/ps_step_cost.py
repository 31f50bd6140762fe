"""One PS worker step's CPU, session by session: where the PS trainer's per-step cost goes.

    python benchmarks/ps_step_cost.py [--blocks 16] [--steps 200]

One PS task (a plain gRPC server) and one worker process, async. The worker
builds, in one graph, ps_train's training graph (ps_train/graph.py) and the
classic program's (benchmarks/bare_ps.py: reference variables, feeds; the two
cannot share a graph in sync mode, whose token queue has one fixed name on the
PS), and runs blocks
of ``--steps`` steps of each way below in turn, the order reversed every other
block, so a machine that speeds up or slows down counts against each way alike:

- classic: the classic program's step through a plain session (its Supervisor's);
- ps_train: ps_train's step (tf.data input, loss and global step fetched) through a plain session;
- ps_train, MonitoredSession: the same through TF's MonitoredSession, no hooks (ps_train's session);
- ps_train, + StopAtStepHook: the same with TF's StopAtStepHook.

For each block it takes the CPU seconds of the worker process and of the PS
task (/proc), per step; the table gives the median and each way's ratio to
ps_train's plain session (the median of the block ratios, with the quartiles).
On 2 cores shared by every task of a PS job, CPU per step is what throughput
pays; the wall time of one worker's step is given beside it.
"""
import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
from benchmarks.bare_ps import cpu_seconds  # noqa: E402
from benchmarks.results_file import save  # noqa: E402
from common.base.errors import cli  # noqa: E402
from common.base.flags import Parser  # noqa: E402

WAYS = ("classic", "ps_train", "ps_train, MonitoredSession", "ps_train, + StopAtStepHook")


def worker(args):
    """The worker process: build every way, then time them block by block."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    from benchmarks.bare_ps import BATCH, HIDDEN, LR, classic_graph
    from common.spec.config import make_config
    from common.inputs.data import load_arrays
    from examples.digits28 import load
    from ps_train.backend import PSBackend
    from ps_train.graph import build_graph
    v1 = tf.compat.v1
    tf.get_logger().setLevel("ERROR")
    cluster = json.loads(args.cluster)
    cfg = make_config(model="mlp", hidden_units=HIDDEN, optimizer="adam", learning_rate=LR, scale_lr=False,
                      batch_size=BATCH, train_steps=10 * args.steps * args.blocks, warmup_steps=0,
                      dataset="examples/digits28.py:load", train_dir=args.train_dir)
    backend = PSBackend(cluster, "worker", 0).setup(cfg)
    graph = build_graph(cfg, backend, backend.plan(cfg, len(load_arrays(cfg)[0])))
    x_train, y_train, _, _ = load(None)
    x_train = x_train.reshape(len(x_train), -1).astype(np.float32)
    onehot = np.eye(10, dtype=np.float32)[y_train.astype(np.int64)]
    with v1.variable_scope("classic"):
        classic = classic_graph(tf, tf.train.ClusterSpec(cluster), 0, False, set(), x_train, onehot, 0)
    ours = [graph.train_op, graph.loss, graph.global_step]
    init = [v1.global_variables_initializer(), graph.data_init]
    config = backend.session_config()
    target = backend.server.target
    plain = v1.Session(target, config=config)
    plain.run(init)
    # the hook adds its read of the global step to the graph, which a MonitoredSession finalizes: first
    hooked = v1.train.MonitoredSession(v1.train.ChiefSessionCreator(master=target, config=config),
                                       hooks=[v1.train.StopAtStepHook(last_step=2 ** 62)])
    monitored = v1.train.MonitoredSession(v1.train.ChiefSessionCreator(master=target, config=config))
    for sess in (hooked, monitored):                   # each session starts its own iterator
        sess.run(graph.data_init)
    feed = {classic.x: x_train[:BATCH], classic.y: onehot[:BATCH]}
    ways = {WAYS[0]: (plain, [classic.train_op, classic.step], feed), WAYS[1]: (plain, ours, None),
            WAYS[2]: (monitored, ours, None), WAYS[3]: (hooked, ours, None)}
    for sess, fetches, fed in ways.values():          # warm every way up
        for _ in range(50):
            sess.run(fetches, feed_dict=fed)
    ps = int(args.ps_pid)
    blocks = collections.defaultdict(list)
    for b in range(args.blocks):
        for name in (WAYS if b % 2 == 0 else WAYS[::-1]):
            sess, fetches, fed = ways[name]
            t, c, p = time.perf_counter(), time.process_time(), cpu_seconds(ps)
            for _ in range(args.steps):
                sess.run(fetches, feed_dict=fed)
            blocks[name].append({"cpu_ms": ((time.process_time() - c) + (cpu_seconds(ps) - p)) / args.steps * 1e3,
                                 "wall_ms": (time.perf_counter() - t) / args.steps * 1e3})
    print("BLOCKS " + json.dumps(blocks), flush=True)
    os._exit(0)                      # sessions of a distributed job are not closed (ps_train/stop.py)


def table(blocks):
    base = blocks[WAYS[1]]
    lines = ["| way | CPU ms per step (worker + PS), median | / ps_train [quartiles] | wall ms per step |",
             "|---|---|---|---|"]
    for name in WAYS:
        ratios = sorted(a["cpu_ms"] / b["cpu_ms"] for a, b in zip(blocks[name], base))
        q = len(ratios) // 4
        lines.append(f"| {name} | {statistics.median(x['cpu_ms'] for x in blocks[name]):.2f} | "
                     f"{statistics.median(ratios):.3f} [{ratios[q]:.3f}, {ratios[-1 - q]:.3f}] | "
                     f"{statistics.median(x['wall_ms'] for x in blocks[name]):.2f} |")
    return lines


@cli
def main():
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--steps", type=int, default=200, help="steps per block")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "ps_step_cost.json"))
    ap.add_argument("--cluster", help=argparse.SUPPRESS)
    ap.add_argument("--ps_pid", help=argparse.SUPPRESS)
    ap.add_argument("--train_dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cluster:
        return worker(args)
    for name in ("blocks", "steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    import tempfile
    from common.base.procs import child_env, free_ports
    ports = free_ports(2)
    cluster = {"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    ps = subprocess.Popen([sys.executable, os.path.join(HERE, "bare_ps.py"), "--role", "ps",
                           "--cluster", json.dumps(cluster)], cwd=REPO, env=child_env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--blocks",
                                str(args.blocks), "--steps", str(args.steps), "--cluster", json.dumps(cluster),
                                "--ps_pid", str(ps.pid), "--train_dir", tmp], cwd=REPO, env=child_env(),
                               capture_output=True, text=True, timeout=1800)
    finally:
        ps.kill()
        ps.wait(timeout=10)
    line = next((x for x in r.stdout.splitlines() if x.startswith("BLOCKS ")), None)
    if line is None:
        raise RuntimeError(f"the worker printed no result (exit {r.returncode}): {r.stderr.strip()[-3000:]}")
    blocks = json.loads(line[7:])
    lines = table(blocks)
    print("\n".join(lines))
    save(args.out, args, blocks=blocks, table=lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
