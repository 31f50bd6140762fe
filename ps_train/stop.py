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
"""
import time

from common.errors import RunError
from common.procs import port_open


def _done_queue(tf, num_slots, ps_index):
    """The queue on PS task ``ps_index`` that carries the chief's 'training is over' code.

    Only this queue may be in the session's graph: the session places every node.
    """
    with tf.device(f"/job:ps/task:{ps_index}"):
        return tf.queue.FIFOQueue(num_slots, tf.int32, shared_name=f"hvdps_done_{ps_index}",
                                  name=f"hvdps_done_{ps_index}")


def serve_until_done(backend, poll_seconds=1.0):
    """PS main loop: serve variables until the chief signals the end; returns its code."""
    import tensorflow as tf
    graph = tf.Graph()
    with graph.as_default():
        dequeue = _done_queue(tf, backend.world_size + 1, backend.index).dequeue()
    cfg = tf.compat.v1.ConfigProto(device_filters=[backend.device])
    opts = tf.compat.v1.RunOptions(timeout_in_ms=int(poll_seconds * 1000))
    last_seen = time.monotonic()
    with tf.compat.v1.Session(backend.server.target, graph=graph, config=cfg) as sess:
        while True:
            try:
                return int(sess.run(dequeue, options=opts))
            except tf.errors.DeadlineExceededError:
                pass
            if port_open(backend.chief_address):
                last_seen = time.monotonic()
            elif time.monotonic() - last_seen > backend.startup_timeout:
                raise RunError(f"ps:{backend.index}: chief {backend.chief_address} unreachable for "
                               f"{backend.startup_timeout:.0f}s (--startup_timeout); giving up")


def signal_done(backend, code=0, timeout=5.0):
    """Chief: tell every PS task to exit with ``code`` (bounded, one PS at a time)."""
    import tensorflow as tf
    opts = tf.compat.v1.RunOptions(timeout_in_ms=int(timeout * 1000))
    for i, addr in enumerate(backend.cluster["ps"]):
        if not port_open(addr):
            continue   # already gone: nothing to tell, and a session to it would wait
        graph = tf.Graph()
        with graph.as_default():
            op = _done_queue(tf, backend.world_size + 1, i).enqueue(code)
        cfg = tf.compat.v1.ConfigProto(device_filters=[f"/job:ps/task:{i}", backend.device])
        try:
            with tf.compat.v1.Session(backend.server.target, graph=graph, config=cfg) as sess:
                sess.run(op, options=opts)
        except tf.errors.OpError:
            pass
