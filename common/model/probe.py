"""The compute part of a step, measured in the job itself: the same step with no distribution.

Every backend's per-step breakdown (docs/metrics.md) divides the measured step
into compute and distribution overhead. Compute is not guessed: after training,
the process that logs (rank 0 / the chief) runs ``probe_steps`` steps of the
same model, optimizer, batch size, input pipeline and thread settings on its own,
with no exchange and no parameter server, and times each one. What the training
step took beyond that is what distributing it cost: the exchange, waiting for
peers or parameter servers, and the bookkeeping around it.

Eager for the TF2 loops (Horovod, bare MPI, the TF2 strategy's chief), a local
graph and session for the classic PS worker (graph mode, as its training is).
"""
import statistics
import time

from common.inputs.data import input_failure, make_dataset
from common.model.models import build_model, make_optimizer, state_updates, total_loss, train_step_fn
from common.model.optim import loss_scaled

WARMUP = 5          # untimed probe steps: tracing, first allocations
CHUNK = 5           # steps per timed interval: as the throughput meter, the median of interval means
BUDGET_S = 20.0     # a big model on a CPU stops early (at least 3 timed steps): peers wait meanwhile
MIN_TIMED = 3


def compute_step_time(cfg, session_config=None):
    """Median seconds of one compute-only step (None when ``--probe_steps 0``)."""
    if cfg.probe_steps <= 0:
        return None
    import tensorflow as tf
    ds = make_dataset(cfg, 0, 1, num_steps=WARMUP + cfg.probe_steps) if tf.executing_eagerly() else None
    try:
        times = (_eager(cfg, ds) if ds is not None else _graph(cfg, session_config))[WARMUP:]
    except tf.errors.OpError as exc:
        # The probe reads the training data from its start: a record the training never reached (an
        # asynchronous job's workers read what the coordinator gave them) ends the run as training's would.
        raise input_failure(exc, "the compute probe, after training") or exc
    # Interval means, not single steps: the training figure is a median of interval rates, and a
    # mean over steps includes the occasional slow one (allocation, prefetch) that a median drops.
    chunks = [times[i:i + CHUNK] for i in range(0, len(times), CHUNK)]
    return statistics.median(sum(c) / len(c) for c in chunks if len(c) == CHUNK or len(chunks) == 1)


def _eager(cfg, ds):
    import tensorflow as tf
    model = build_model(cfg)
    step = tf.function(train_step_fn(model, loss_scaled(cfg, make_optimizer(cfg, cfg.learning_rate))), autograph=False,
                       jit_compile=cfg.jit_compile or None)   # the compute as training ran it

    batches = iter(ds)                           # as the training loop: next batch, step, read the loss
    return _timed(lambda: float(step(*next(batches))), WARMUP + cfg.probe_steps)


def _timed(one_step, n):
    """Seconds of each of up to ``n`` steps; stops early past BUDGET_S (after MIN_TIMED timed)."""
    times, t0 = [], time.perf_counter()
    for _ in range(n):
        one_step()
        now = time.perf_counter()
        times.append(now - t0)
        t0 = now
        if len(times) >= WARMUP + MIN_TIMED and sum(times) > BUDGET_S:
            break
    return times


def _graph(cfg, session_config):
    import tensorflow as tf
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        ds = make_dataset(cfg, 0, 1, num_steps=WARMUP + cfg.probe_steps)
        x, y = v1.data.make_one_shot_iterator(ds).get_next()
        model = build_model(cfg)
        logits = model(x, training=True)
        loss = total_loss(model, y, logits)
        optimizer = loss_scaled(cfg, make_optimizer(cfg, cfg.learning_rate, api="v1"), api="v1")
        train_op = tf.group(optimizer.minimize(
            loss, var_list=model.trainable_variables), *state_updates(model, x))
        init = v1.global_variables_initializer()
    with v1.Session(graph=graph, config=session_config) as sess:
        sess.run(init)
        return _timed(lambda: sess.run([train_op, loss]), WARMUP + cfg.probe_steps)


def breakdown(compute_s, samples_per_sec, workers, batch_size, wire=None, exchange_s=None, wait_s=None,
              input_s=None):
    """The summary's ``breakdown`` record: one worker's step split into compute and overhead.

    ``step_s`` comes from the measured throughput (median over logging intervals):
    ``workers`` batches of ``batch_size`` are computed in parallel, one per worker,
    so a worker's step takes workers * batch / (samples/sec) for every backend alike
    (sync: one step per update; async: each worker at its own pace). ``wait_s``,
    where a backend measures it, is the part of the overhead spent waiting for the
    other workers (sync PS: for the step's token); the rest is the transfers and contention.
    ``input_s``, where the loop reads its batches in Python (the all-reduce trainers' custom
    loop), is the mean time a step waited for its next batch at the iterator: the input's part of
    the step, inside compute (the probe reads its batches as the loop does).
    """
    if not compute_s or not samples_per_sec:
        return None
    step_s = workers * batch_size / samples_per_sec
    out = {"step_s": step_s, "compute_s": compute_s, "overhead_s": step_s - compute_s,
           "overhead_share": (step_s - compute_s) / step_s,
           "probe": "rank 0 / chief alone after training: same model, batch, input pipeline, threads; "
                    "no exchange"}
    out.update(wire or {})
    if exchange_s is not None:
        out["exchange_s"] = exchange_s
    if wait_s is not None:
        out["wait_s"], out["wait_share"] = wait_s, wait_s / step_s
    if input_s is not None:
        out["input_s"], out["input_share"] = input_s, input_s / step_s
    return out
