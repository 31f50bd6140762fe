"""Parameter-server trainer on TensorFlow's gRPC runtime (between-graph replication).

Launch one process per role, the way the classic distributed-TF examples do:

    python ps_train/main.py --job_name=ps     --task_index=0 --ps_hosts=h1:2222 --worker_hosts=h2:2222,h3:2222
    python ps_train/main.py --job_name=worker --task_index=0 --ps_hosts=h1:2222 --worker_hosts=h2:2222,h3:2222
    python ps_train/main.py --job_name=worker --task_index=1 --ps_hosts=h1:2222 --worker_hosts=h2:2222,h3:2222 --sync

or with Kubeflow's TF_CONFIG instead of the host flags (the chief, if listed, trains too):

    TF_CONFIG='{"cluster":{"chief":["c:2222"],"ps":["p:2222"],"worker":["w:2222"]},
                "task":{"type":"worker","index":0}}' python ps_train/main.py

or all roles on this machine with free ports:

    python -m ps_train.launch --num_ps 2 --num_workers 2 [--sync] [trainer flags]

Worker 0 (or the chief) initialises the variables, evaluates, and writes
checkpoints, TensorBoard events and metrics.jsonl; at the end it tells every PS
to exit. Lines marked ``# PS:`` are the only differences from single-process code.
"""
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # keep TF's C++ start-up chatter out of the logs
if __package__ in (None, ""):   # run as a script: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.backend import get_backend
from common.config import build_parser, from_args
from common.data import load_arrays, make_dataset, plan
from common.errors import RunError, cli
from common.models import build_model, gradient_bytes, loss_fn
from common.training import (RunLog, Watchdog, check_resume_compatible, check_train_dir,
                             make_lr_schedule, save_weights_npz)
from ps_train.backend import add_ps_args, describe_placement, make_v1_optimizer, resolve_cluster

STALL_SECONDS = 10.0   # a worker without a step for this long is reported lost (async)


def make_parser():
    return add_ps_args(build_parser(__doc__.splitlines()[0], prog="ps_train/main.py"))


def validate_trainer_args(argv):
    """Parse and validate trainer flags without starting anything (used by the launcher)."""
    return from_args(make_parser().parse_args(list(argv)))


@cli(hard_exit=True)
def main(argv=None):
    args = make_parser().parse_args(argv)
    cfg = from_args(args)
    cluster, job, index = resolve_cluster(args)  # PS: flags, --cluster_spec or TF_CONFIG
    backend = get_backend("ps", cluster=cluster, job=job, index=index, sync=args.sync,
                          replicas_to_aggregate=args.replicas_to_aggregate,
                          startup_timeout=args.startup_timeout, step_timeout=args.step_timeout)
    if backend.is_chief:
        check_train_dir(cfg)
        if cfg.resume:
            check_resume_compatible(cfg, cfg.train_dir)
    num_train = 0 if backend.is_ps else len(load_arrays(cfg)[0])
    backend.setup(cfg)                           # PS: start this task's gRPC server
    if backend.is_ps:                            # PS: serve variables until the chief says stop
        print(f"ps:{index} serving on {cluster['ps'][index]}", flush=True)
        backend.serve_until_done()
        print(f"ps:{index} done", flush=True)
        _exit(0)
    backend.wait_for_ps()                        # PS: bounded wait instead of a silent hang

    import tensorflow as tf
    tf.get_logger().setLevel("ERROR")            # v1 deprecation notices would drown the progress lines
    _quiet_queue_runner_shutdown(tf)
    n, R, b = backend.world_size, backend.replicas_to_aggregate, cfg.batch_size
    # PS: budgets are in samples, so both backends see the same data: one
    # Horovod step = n*b samples; one PS update = R*b samples.
    spe, total_steps, _ = plan(cfg, num_train, n)
    updates_per_epoch = spe * n // R
    target_updates = total_steps * n // R

    with tf.compat.v1.device(backend.device_setter()):     # PS: variables on the PS tasks, round-robin
        global_step = tf.compat.v1.train.get_or_create_global_step()
        model = build_model(cfg)
        train_ds = make_dataset(cfg, backend.rank, n, num_steps=total_steps * n)
        x, y = tf.compat.v1.data.make_one_shot_iterator(train_ds).get_next()
        loss = loss_fn()(y, model(x, training=True))
        lr = make_lr_schedule(cfg, updates_per_epoch, R)(global_step)
        optimizer = backend.wrap_optimizer(make_v1_optimizer(cfg, lr))   # PS: sync wraps
        worker_steps = tf.compat.v1.get_variable("hvdps/worker_steps", [n], tf.int64,
                                                 tf.compat.v1.zeros_initializer(), trainable=False)
        worker_done = tf.compat.v1.get_variable("hvdps/worker_done", [n], tf.int64,
                                                tf.compat.v1.zeros_initializer(), trainable=False)
        train_op = optimizer.minimize(loss, global_step=global_step, var_list=model.trainable_variables)
        with tf.control_dependencies([train_op]):
            train_op = tf.compat.v1.scatter_add(worker_steps, [backend.rank], [1]).op
        mark_done = tf.compat.v1.scatter_update(worker_done, [backend.rank], [1]).op
        eval_fetch, eval_init = _eval_ops(tf, cfg, model) if backend.is_chief else (None, None)

    hooks = [tf.compat.v1.train.StopAtStepHook(last_step=target_updates)]
    if args.sync:                                # PS: chief runs the token queue; no spare tokens
        hooks.append(optimizer.make_session_run_hook(backend.is_chief, num_tokens=max(0, R - n)))
    if not backend.is_chief:
        _wait_until_initialised(tf, backend)     # PS: the chief initialises (or restores)
    log = RunLog(cfg, backend, target_updates, backend.samples_per_update(b),
                 extra_header={"cluster": cluster, "replicas_to_aggregate": R,
                               "global_step_unit": f"one update = {R} worker batch(es) of {b}",
                               "updates_per_epoch": updates_per_epoch,
                               "placement": describe_placement(tf.compat.v1.global_variables()),
                               "loss_source": "chief's own batches"})
    if backend.is_chief:                         # PS: say once what a global step is
        print(f"{backend.mode} mode, {n} workers, {backend.num_ps} PS: global step = updates applied on the PS; "
              f"1 update = {R} worker batch(es) of {b} = {R * b} samples; target {target_updates} updates "
              f"= {target_updates * R * b} samples", flush=True)
    ckpt_dir = os.path.join(cfg.train_dir, "checkpoints")
    step_opts = tf.compat.v1.RunOptions(timeout_in_ms=int(args.step_timeout * 1000))
    dog = Watchdog(args.startup_timeout + args.step_timeout, f"{job}:{index}: session did not start")
    status, lost = "ok", []
    try:
        with tf.compat.v1.train.MonitoredTrainingSession(
                master=backend.server.target, is_chief=backend.is_chief, hooks=hooks,
                checkpoint_dir=ckpt_dir if backend.is_chief else None,
                save_checkpoint_steps=(updates_per_epoch if cfg.checkpoint_every_epoch else target_updates)
                if backend.is_chief else None,
                save_checkpoint_secs=None, save_summaries_steps=None, save_summaries_secs=None,
                log_step_count_steps=0, config=backend.session_config(),
                max_wait_secs=args.startup_timeout, stop_grace_period_secs=5) as sess:
            dog.kick(f"{job}:{index}: a training step blocked (lost PS or sync peer?)")
            raw = lambda fetches: sess.run_step_fn(lambda step_context: step_context.session.run(fetches))
            gstep = raw(global_step)
            last_epoch, local, evaluated_at = gstep // updates_per_epoch, 0, None
            stall = {}
            while not sess.should_stop():
                try:
                    _, loss_v, gstep = sess.run([train_op, loss, global_step], options=step_opts)
                except tf.errors.DeadlineExceededError:
                    raise RunError(f"{job}:{index}: no update for {args.step_timeout:.0f}s "
                                   f"({backend.mode} mode): a worker or PS was lost")
                dog.kick()
                local += 1
                if not backend.is_chief:
                    continue
                if local % cfg.log_every == 0:       # PS: chief reports every worker's progress
                    counts = raw(worker_steps)
                    lost = _lost_workers(counts, stall, backend)
                    log.step(gstep, float(loss_v), lr=float(raw(lr)), worker_steps=counts.tolist(),
                             lost_workers=lost)
                if gstep // updates_per_epoch > last_epoch or gstep >= target_updates:
                    last_epoch = gstep // updates_per_epoch
                    if cfg.eval_every_epoch or gstep >= target_updates:
                        log.eval(max(1, last_epoch), gstep, *_evaluate(raw, eval_init, eval_fetch))
                        evaluated_at = gstep
            raw(mark_done)
            if backend.is_chief:
                final = raw(global_step)
                lost = _wait_for_workers(raw, worker_steps, worker_done, stall, backend, dog)
                if evaluated_at != final:
                    log.eval(max(1, final // updates_per_epoch), final, *_evaluate(raw, eval_init, eval_fetch))
                save_weights_npz(raw(model.weights), os.path.join(cfg.train_dir, "weights.npz"))
                log.finish(final, gradient_bytes(model), status=status, lost_workers=lost,
                           worker_steps=raw(worker_steps).tolist(), num_ps=backend.num_ps)
    except BaseException:
        if backend.is_chief:                     # PS: a failed chief still releases the PS tasks
            backend.signal_done(1)
        raise
    dog.stop()
    if backend.is_chief:
        if lost:
            print(f"chief: finished without worker(s) {', '.join(lost)} (lost during training)", flush=True)
        backend.signal_done()                    # PS: let every PS task exit
    _exit(0)


def _eval_ops(tf, cfg, model):
    test_ds = make_dataset(cfg, 0, 1, split="test").unbatch().batch(256)
    it = tf.compat.v1.data.make_initializable_iterator(test_ds)
    xt, yt = it.get_next()
    logits = model(xt, training=False)
    per_example = tf.keras.losses.sparse_categorical_crossentropy(yt, logits, from_logits=True)
    correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32),
                                             tf.cast(yt, tf.int32)), tf.float64))
    fetch = (tf.reduce_sum(tf.cast(per_example, tf.float64)), correct, tf.cast(tf.size(yt), tf.float64))
    return fetch, it.initializer


def _evaluate(raw, init, fetch):
    import tensorflow as tf
    raw(init)
    total = [0.0, 0.0, 0.0]
    while True:
        try:
            part = raw(fetch)
        except tf.errors.OutOfRangeError:
            break
        total = [a + b for a, b in zip(total, part)]
    return total[0] / total[2], total[1] / total[2]


def _lost_workers(counts, stall, backend):
    """Workers whose step count has not moved for STALL_SECONDS (async keeps going without them)."""
    now = time.monotonic()
    lost = []
    for rank, c in enumerate(counts):
        prev = stall.get(rank)
        if prev is None or prev[0] != c:
            stall[rank] = (c, now)
        elif now - prev[1] > STALL_SECONDS:
            lost.append(_names(backend)[rank])
    return lost


def _wait_for_workers(raw, worker_steps, worker_done, stall, backend, dog, grace=60.0):
    """Before the PS tasks go away, let every live worker finish its last step."""
    deadline = time.monotonic() + grace
    while True:
        dog.kick()
        done = raw(worker_done)
        lost = _lost_workers(raw(worker_steps), stall, backend)
        lost = [name for rank, name in enumerate(_names(backend)) if name in lost and not done[rank]]
        pending = [name for rank, name in enumerate(_names(backend)) if not done[rank] and name not in lost]
        if not pending or time.monotonic() > deadline:
            return lost
        time.sleep(0.2)


def _names(backend):
    return [f"{job}:{i}" for job, i in backend.replica_list]


def _wait_until_initialised(tf, backend):
    """Poll every 0.2s (TF's own SessionManager polls every 30s) until the chief has initialised."""
    check = tf.compat.v1.report_uninitialized_variables(tf.compat.v1.global_variables())
    deadline = time.monotonic() + backend.startup_timeout
    opts = tf.compat.v1.RunOptions(timeout_in_ms=5000)
    with tf.compat.v1.Session(backend.server.target, config=backend.session_config()) as sess:
        while True:
            try:
                if len(sess.run(check, options=opts)) == 0:
                    return
            except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError):
                pass
            if time.monotonic() > deadline:
                raise RunError(f"{backend.job}:{backend.index}: the chief did not initialise the model "
                               f"within {backend.startup_timeout:.0f}s (--startup_timeout)")
            time.sleep(0.2)


def _quiet_queue_runner_shutdown(tf):
    """SyncReplicasOptimizer's token thread is cancelled when the session closes; that is the end, not an error."""
    import threading
    default = threading.excepthook

    def hook(args):
        if isinstance(args.exc_value, tf.errors.CancelledError) and "QueueRunner" in (args.thread.name or ""):
            return
        default(args)

    threading.excepthook = hook


def _exit(code):
    """Leave without tearing down the gRPC server threads (TF cannot stop a Server cleanly)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
