"""What one PS training step sends over the wire (ps_train/graph.py), from its partition graphs.

Every tensor that crosses between a worker and a PS task is a RecvTensor RPC
of its own; on a small model those RPCs, not the bytes, are the step. The
update's constants (learning rate, Adam's beta1/beta2/epsilon, the step
counter's index and increment) must live on the PS, so an async step sends
the PS exactly one tensor per gradient and nothing else, and no PS task sends
another anything.
"""
import json
import subprocess
import sys

import pytest

from common.base.procs import free_ports
from tests.conftest import REPO, env, py

# The worker runs in its own process (graph mode and a gRPC server would outlive the test in
# pytest's), the PS tasks as ps_train's own; every server listens on loopback only (listen.py).
TRACE = r'''
import json, sys
from common.spec.config import make_config
from common.inputs.data import load_arrays
from ps_train.backend import PSBackend
from ps_train.graph import build_graph
from tf_cluster.listen import listen_only_on
import tensorflow as tf
v1 = tf.compat.v1
cluster, optimizer, sync = json.loads(sys.argv[1]), sys.argv[2], sys.argv[4] == "sync"
cfg = make_config(model="mlp", hidden_units=16, optimizer=optimizer, batch_size=8, train_steps=50,
                  dataset="digits", train_dir=sys.argv[3])
backend = PSBackend(cluster, "worker", 0, sync=sync)
listen_only_on(backend, None)          # may re-execute this script with the bind shim
backend.setup(cfg)
graph = build_graph(cfg, backend, backend.plan(cfg, len(load_arrays(cfg)[0])))
with v1.Session(backend.server.target, config=backend.session_config()) as sess:
    sess.run([v1.global_variables_initializer(), graph.data_init])
    if sync:                           # what the chief's session hook does: its queue runner makes the tokens
        sess.run(graph.optimizer.chief_init_op)
        graph.optimizer.get_chief_queue_runner().create_threads(sess, start=True, daemon=True)
    for _ in range(3):
        sess.run([graph.train_op, graph.loss, graph.global_step])
    meta = v1.RunMetadata()
    sess.run([graph.train_op, graph.loss, graph.global_step], run_metadata=meta,
             options=v1.RunOptions(output_partition_graphs=True))
    counts = sess.run(graph.worker_steps).tolist()
    waited = sess.run(graph.sync_wait).tolist() if sync else None
# Every tensor a partition receives from another task is a _Recv node of it. Control edges
# travel as _Recv too: an empty signal (e.g. the train op's group waiting for each PS's
# update) that reaches its op through an Identity used only as a control input. Those are
# left out: only a _Recv whose value some op reads carries data.
edges, signals, signal_edges = [], 0, []
for g in meta.partition_graphs:
    readers = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i.lstrip("^").split(":")[0], []).append((n, i.startswith("^")))
    def carries_data(name):
        return any(not control and (n.op != "Identity" or carries_data(n.name))
                   for n, control in readers.get(name, []))
    for n in g.node:
        src, dst = n.attr["send_device"].s.decode(), n.attr["recv_device"].s.decode()
        if n.op == "_Recv" and src.split("/")[1:4] != dst.split("/")[1:4]:
            if carries_data(n.name):
                edges.append((n.attr["tensor_name"].s.decode(), src, dst))
            else:
                signals += 1
                signal_edges.append((n.attr["tensor_name"].s.decode(), src, dst))
print("TRACE " + json.dumps({"edges": edges, "signals": signals, "signal_edges": signal_edges,
                             "worker_steps": counts, "sync_wait": waited,
                             "variables": [v.op.name for v in graph.model.trainable_variables]}))
'''


def crossings(edge):
    """(tensor name, from job, to job) of one _Recv of the step's partition graphs."""
    name, src, dst = edge
    return name, src.split("/")[1][4:], dst.split("/")[1][4:]


def trace_step(tmp_path, num_ps, optimizer, mode):
    """The TRACE script's findings for one worker against ``num_ps`` ps_train PS tasks."""
    ports = free_ports(num_ps + 1)
    cluster = {"ps": [f"127.0.0.1:{p}" for p in ports[:num_ps]], "worker": [f"127.0.0.1:{ports[-1]}"]}
    hosts = [f"--ps_hosts={','.join(cluster['ps'])}", f"--worker_hosts={cluster['worker'][0]}"]
    servers = [subprocess.Popen([sys.executable, "-m", "ps_train.main", "--job_name=ps", f"--task_index={i}",
                                 *hosts], cwd=REPO, env=env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL) for i in range(num_ps)]
    try:
        r = py("-c", TRACE, json.dumps(cluster), optimizer, str(tmp_path / "run"), mode, timeout=180)
    finally:
        for p in servers:
            p.kill()
            p.wait(timeout=10)
    line = next((x for x in r.stdout.splitlines() if x.startswith("TRACE ")), None)
    assert line, f"exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return json.loads(line[6:])


@pytest.mark.parametrize("workers, per_update, sync, steps", [
    (2, 2, True, 60 * 2),            # sync with every worker: one batch an update each (the shared bound)
    (2, 1, False, 60 * 2),           # async: every update of the job, a lost peer's share included
    (2, 1, True, 2 * (120 + 1)),     # 1 backup of 2: two pushes an update, at worst all one worker's
    (4, 3, True, 4 * (80 + 1)),      # 1 backup of 4: 80 updates of 3 batches, four pushes each
])
def test_a_workers_stream_covers_every_push_the_job_may_ask_of_it(workers, per_update, sync, steps):
    """With backups, SyncReplicasOptimizer's N tokens an update go to whoever asks, so a fast worker
    pushes a slow one's share too, the dropped pushes included: its stream must not run dry before the
    job's target (60 worker steps of the plan)."""
    from common.spec.plan import RunPlan
    from ps_train.graph import stream_steps
    plan = RunPlan(workers=workers, batch_size=32, batches_per_update=per_update, steps_per_epoch=10,
                   worker_steps=60, lr_scale=per_update)
    assert stream_steps(plan, sync) == steps


@pytest.mark.parametrize("num_ps, optimizer, variables", [
    (1, "adam", 4),
    (4, "adam", 7),             # the 64 x 16 kernel (4 KB, over MIN_SHARD_BYTES) in one piece per PS task
    (1, "momentum", 4),
])
@pytest.mark.process
def test_async_step_sends_the_ps_only_gradients(tmp_path, num_ps, optimizer, variables):
    data = trace_step(tmp_path, num_ps, optimizer, "async")
    moves = [crossings(e) for e in data["edges"]]
    to_ps = [name for name, src, dst in moves if src == "worker" and dst == "ps"]
    to_worker = [name for name, src, dst in moves if src == "ps" and dst == "worker"]
    n_vars = len(data["variables"])
    assert n_vars == variables, data["variables"]
    # One gradient per variable reaches the PS, and nothing else: no learning rate, no optimizer
    # constant, no counter index (each would be a RecvTensor RPC of its own every step).
    assert len(to_ps) == n_vars and all("grad" in name for name in to_ps), to_ps
    # The worker reads each variable once, and the global step it fetches.
    assert len(to_worker) == n_vars + 1 and sum("global_step" in n for n in to_worker) == 1, to_worker
    # Nothing crosses between PS tasks: each task's update reads its own optimizer state (Adam's
    # powers) and signals no other task (ps_train.graph.apply_on_each_ps).
    between = [name for name, src, dst in [*moves, *map(crossings, data["signal_edges"])] if src == dst == "ps"]
    assert between == [], between
    # The counter still counts: 4 steps of this worker.
    assert data["worker_steps"] == [4]


@pytest.mark.process
def test_sync_wait_is_timed_on_the_ps_without_sending_more(tmp_path):
    """Sync: SyncReplicasOptimizer's own traffic and nothing else. Timing the wait for the token
    (ps_train.graph.time_token_wait) happens beside the dequeue on the PS and is grouped there
    with the step counter, a target of the step on the PS: no tensor and no control signal
    crosses for either."""
    data = trace_step(tmp_path, 1, "adam", "sync")
    moves = [crossings(e) for e in data["edges"]]
    to_ps = [name for name, src, dst in moves if src == "worker" and dst == "ps"]
    to_worker = [name for name, src, dst in moves if src == "ps" and dst == "worker"]
    # each accumulator gets its gradient and the worker's local step (SyncReplicasOptimizer's staleness
    # check): the local step crosses once, read once for all four (ps_train.graph.local_step_read_once),
    # as the classic program's reference variable is
    assert len(to_ps) == 4 + 1 and sum("grad" in name for name in to_ps) == 4, to_ps
    assert sum("sync_rep_local_step" in name for name in to_ps) == 1, to_ps
    # the worker reads each variable, the global step it fetches, and its token
    assert len(to_worker) == 4 + 2 and sum("sync_token_q" in n for n in to_worker) == 1, to_worker
    # no signal: the PS-side bookkeeping (counter + wait) is a target of the step on the PS, done when
    # the PS's part of the step returns; the worker's part ends with the token it receives
    assert data["signals"] == 0, data["signals"]
    assert data["worker_steps"] == [4] and data["sync_wait"][0] > 0
