"""How a parameter-server job ends: the whole protocol in one place.

TensorFlow's ``server.join()`` never returns, which is why classic PS jobs
"never exit". Here every PS task waits on a FIFOQueue of its own (TensorFlow's
queue, shared by name across sessions) instead:

1. The chief finishes (or fails), waits for live workers to mark themselves
   done (ps_train.chief), then enqueues its exit code on every PS's queue
   (``signal_done``), best effort and bounded.
2. A PS leaves ``serve_until_done`` when it dequeues that code, and exits 0
   (it was released cleanly; the code is printed). It also gives up, with an error, if the chief's port stays closed
   for longer than --startup_timeout: a PS launched by hand never outlives a
   crashed job for good, yet a chief restarted within that time finds it alive.
3. Workers stop at the target global step; one that loses a PS ends itself
   (ps_train.main's liveness check); the local launcher (ps_train.launch)
   kills whatever is left when the chief is gone.

TF2's ParameterServerStrategy (``--ps_api v2``, ps_train/v2.py) uses the same
protocol for its worker tasks too: they are servers there, like the PS tasks,
and the coordinator releases both.
"""
import os
import sys
import threading
import time

from common.errors import RunError
from common.procs import port_open

QUEUE_SLOTS = 4      # the chief enqueues once; a failing chief may try twice


def _done_queue(tf, job, index):
    """The queue on task ``job:index`` that carries the chief's 'training is over' code.

    Only this queue may be in the session's graph: the session places every node.
    """
    with tf.device(f"/job:{job}/task:{index}"):
        return tf.queue.FIFOQueue(QUEUE_SLOTS, tf.int32, shared_name=f"hvdps_done_{job}_{index}",
                                  name=f"hvdps_done_{job}_{index}")


def serve_until_done(backend, poll_seconds=1.0):
    """Server main loop (a PS; a TF2 worker): serve until the chief signals the end; returns its code."""
    import tensorflow as tf
    graph = tf.Graph()
    with graph.as_default():
        dequeue = _done_queue(tf, backend.job, backend.index).dequeue()
    cfg = tf.compat.v1.ConfigProto(device_filters=[backend.device])
    opts = tf.compat.v1.RunOptions(timeout_in_ms=int(poll_seconds * 1000))
    last_seen = time.monotonic()
    who = f"{backend.job}:{backend.index}"
    with tf.compat.v1.Session(backend.server.target, graph=graph, config=cfg) as sess:
        while True:
            try:
                return int(sess.run(dequeue, options=opts))
            except tf.errors.DeadlineExceededError:
                pass
            if port_open(backend.chief_address):
                last_seen = time.monotonic()
            elif time.monotonic() - last_seen > backend.startup_timeout:
                raise RunError(f"{who}: chief {backend.chief_address} unreachable for "
                               f"{backend.startup_timeout:.0f}s (--startup_timeout); giving up")


def signal_done(tasks, code=0, timeout=15.0):
    """Chief: tell each ``(job, index, address)`` task to exit with ``code``; bounded, all at once.

    Each task is reached through its own gRPC master, so the chief needs no
    server of its own for this (TF2's coordinator has none it could lend).
    A released task exits at once, and with GRPC_FAIL_FAST=use_caller (TF2)
    closing the session to it can then wait for it forever: each message goes
    from a daemon thread, waited for at most ``timeout`` seconds in all (15 s: a loaded machine took more
    than 5 s to reach a second PS once; the local launcher waits 30 s for the PS to leave).
    """
    threads = [threading.Thread(target=_tell, args=(job, i, addr, code, timeout), daemon=True,
                                name=f"hvdps-release-{job}-{i}") for job, i, addr in tasks]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))


def _tell(job, index, addr, code, timeout):
    """Enqueue ``code`` on one task's queue, trying again until ``timeout``.

    A TF2 chief runs with GRPC_FAIL_FAST=use_caller, so a call on a channel that
    is not connected yet fails at once (Unavailable) instead of waiting: one
    try could leave a worker unreleased (seen once in CI). An extra enqueue
    after a call that did arrive is harmless: the queue has spare slots and
    the task reads one code.
    """
    import tensorflow as tf
    deadline = time.monotonic() + timeout
    graph = tf.Graph()
    with graph.as_default():
        op = _done_queue(tf, job, index).enqueue(code)
    cfg = tf.compat.v1.ConfigProto(device_filters=[f"/job:{job}/task:{index}"])
    sess = None
    while time.monotonic() < deadline:
        if not port_open(addr):
            return     # already gone: nothing to tell, and a session to it would wait
        try:
            sess = sess or tf.compat.v1.Session(f"grpc://{addr}", graph=graph, config=cfg)
            left = max(0.1, deadline - time.monotonic())
            sess.run(op, options=tf.compat.v1.RunOptions(timeout_in_ms=int(left * 1000)))
            _KEEP.append(sess)     # never closed: the process ends right after (hard_exit)
            return
        except tf.errors.OpError:
            time.sleep(0.2)


_KEEP = []


def never_close(session):
    """Keep ``session`` referenced until hard_exit, so its __del__ never closes it.

    Closing a distributed session is a round of RPCs to every task it touched
    (and MonitoredSession first waits for its threads); nothing depends on it
    once the results are written and the PS tasks are told to leave.
    """
    _KEEP.append(session)
    return session


def hard_exit(code):
    """Leave without tearing down the gRPC server threads (TF cannot stop a Server cleanly)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
