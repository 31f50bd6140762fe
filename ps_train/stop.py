"""How a parameter-server job ends: the whole protocol in one place.

TensorFlow's ``server.join()`` never returns, which is why classic PS jobs
"never exit". Here every PS task waits on a FIFOQueue of its own (TensorFlow's
queue, shared by name across sessions) instead:

1. The chief finishes (or fails), waits for live workers to mark themselves
   done (ps_train.chief), then enqueues its exit code on every PS's queue
   (``signal_done``), best effort and bounded; a task it cannot reach is named.
2. A PS leaves ``serve_until_done`` when that code is on its queue, and exits 0
   (it was released cleanly; the code is printed). It also gives up, with an error, if the chief's port stays closed
   for longer than --startup_timeout: a PS launched by hand never outlives a
   crashed job for good, yet a chief restarted within that time finds it alive.
3. Workers stop at the target global step; one that loses a PS ends itself
   (ps_train.classic's liveness check); the local launcher (ps_train.launch)
   kills whatever is left when the chief is gone.

TF2's ParameterServerStrategy (``--ps_api v2``, ps_train/v2.py) uses the same
protocol for its worker tasks too: they are servers there, like the PS tasks,
and the coordinator releases both.
"""
import os
import sys
import threading
import time

from common.base.errors import RunError
from common.base.procs import port_open

QUEUE_SLOTS = 4      # the chief enqueues once; a failing chief may try twice


def _done_queue(tf, job, index):
    """The queue on task ``job:index`` that carries the chief's 'training is over' code.

    Only this queue may be in the session's graph: the session places every node.
    """
    with tf.device(f"/job:{job}/task:{index}"):
        return tf.queue.FIFOQueue(QUEUE_SLOTS, tf.int32, shared_name=f"hvdps_done_{job}_{index}",
                                  name=f"hvdps_done_{job}_{index}")


def serve_until_done(backend, poll_seconds=0.25):
    """Server main loop (a PS; a TF2 worker): serve until the chief signals the end; returns its code.

    The queue is watched through its size, which reads without taking: a dequeue
    that times out can still take the element that arrived in the same instant
    and drop it with the timed-out step (measured: 7 of 300 codes lost at a 5 ms
    timeout), and a PS that missed its release would wait out --startup_timeout
    and fail. The code is taken only once it is there; if even that read fails,
    the task was still released (None).
    """
    import tensorflow as tf
    graph = tf.Graph()
    with graph.as_default():
        queue = _done_queue(tf, backend.job, backend.index)
        size, dequeue = queue.size(), queue.dequeue()
    # operation_timeout_in_ms bounds the session's creation (unbounded, it retries a failed connection for good)
    cfg = tf.compat.v1.ConfigProto(device_filters=[backend.device], operation_timeout_in_ms=10_000)
    opts = tf.compat.v1.RunOptions(timeout_in_ms=10_000)
    last_seen = time.monotonic()
    who = f"{backend.job}:{backend.index}"
    sess = None
    while True:
        try:
            sess = sess or never_close(tf.compat.v1.Session(backend.server.target, graph=graph, config=cfg))
            if sess.run(size, options=opts) > 0:
                try:
                    return int(sess.run(dequeue, options=opts))
                except tf.errors.OpError:
                    return None
        except tf.errors.DeadlineExceededError:
            pass
        except (tf.errors.UnavailableError, tf.errors.AbortedError):
            sess = None            # a session of its own that lost its channel: a new one, the queue stays
        time.sleep(poll_seconds)
        if port_open(backend.chief_address):
            last_seen = time.monotonic()
        elif time.monotonic() - last_seen > backend.startup_timeout:
            raise RunError(f"{who}: chief {backend.chief_address} unreachable for "
                           f"{backend.startup_timeout:g}s (--startup_timeout); giving up")


FIRST_TRY_SECONDS = 3.0   # one try at releasing a task; each next try may take twice as long


def signal_done(tasks, code=0, timeout=15.0, out=sys.stdout):
    """Chief: tell each ``(job, index, address)`` task to exit with ``code``; bounded, all at once.

    Each task is reached through its own gRPC master, so the chief needs no
    server of its own for this (TF2's coordinator has none it could lend).
    Two phases: first a session to every task is made and used once, then the
    codes go out. Creating a session makes the task's master look up the
    devices of its peers (ps:0's master asked ps:1 in the logs; likely the PS
    servers' default config, which filters on every PS), so a
    session created after a peer was released can wait for that peer forever
    (seen with two PS tasks on a loaded machine). Each message goes from a
    daemon thread, waited for at most ``timeout`` seconds in all (15 s: the
    local launcher waits 30 s for the tasks to leave). A task the chief could
    not reach is named on ``out``: it is left to its launcher (or to its own
    --startup_timeout once the chief's port is closed).

    Returns {"job:index": status}: "released" (the task answered), "left" (its
    port closed after a try was out: the message arrived and it exited before
    answering), "gone" (closed before any try) or "unreached: <last error>".
    """
    deadline = time.monotonic() + timeout
    status = {f"{job}:{i}": "unreached: no answer" for job, i, _ in tasks}
    sessions = {}
    _in_threads([(_connect, (job, i, addr, code, deadline - timeout / 2, sessions)) for job, i, addr in tasks],
                deadline - timeout / 2)
    _in_threads([(_tell, (job, i, addr, code, deadline, status, sessions.get(f"{job}:{i}")))
                 for job, i, addr in tasks], deadline)
    result = dict(status)
    for (job, i, addr) in tasks:
        if result[f"{job}:{i}"].startswith("unreached"):
            print(f"chief: could not release {job}:{i} ({addr}) within {timeout:g}s "
                  f"({result[f'{job}:{i}'][len('unreached: '):]}); it is left to its launcher",
                  file=out, flush=True)
    return result


def _in_threads(calls, deadline):
    threads = [threading.Thread(target=f, args=a, daemon=True, name=f"hvdps-release-{a[0]}-{a[1]}")
               for f, a in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))


def _graph(job, index, code):
    import tensorflow as tf
    graph = tf.Graph()
    with graph.as_default():
        queue = _done_queue(tf, job, index)
        return graph, queue.enqueue(code), queue.size()


def _session(job, index, addr, graph, seconds):
    """A session to one task, never closed (closing waits on the task; the process ends soon, hard_exit).

    ``operation_timeout_in_ms`` bounds its creation, which otherwise retries a failed connection for good.
    """
    import tensorflow as tf
    cfg = tf.compat.v1.ConfigProto(device_filters=[f"/job:{job}/task:{index}"],
                                   operation_timeout_in_ms=int(seconds * 1000))
    return never_close(tf.compat.v1.Session(f"grpc://{addr}", graph=graph, config=cfg))


def _bounded_run(sess, fetch, seconds, addr):
    """Run ``fetch`` in a thread of its own: (finished, error or None, port closed meanwhile)."""
    import tensorflow as tf
    outcome = []

    def attempt():
        try:
            sess.run(fetch, options=tf.compat.v1.RunOptions(timeout_in_ms=int(seconds * 1000)))
            outcome.append(None)
        except tf.errors.OpError as exc:
            outcome.append((exc.message or type(exc).__name__).strip().splitlines()[-1][:200])
    t = threading.Thread(target=attempt, daemon=True, name="hvdps-release-try")
    t.start()
    end = time.monotonic() + seconds + 1.0
    t.join(0.05)
    while t.is_alive() and time.monotonic() < end:
        if not port_open(addr):
            return False, None, True
        t.join(0.1)
    if t.is_alive():
        return False, "no answer within the try", False
    return True, outcome[0], False


def _connect(job, index, addr, code, deadline, sessions):
    """Phase 1: a session to the task, created and used once (a read of its queue's size)."""
    graph, op, size = _graph(job, index, code)
    try_s = FIRST_TRY_SECONDS / 2
    while time.monotonic() < deadline and port_open(addr):
        try_s = max(0.1, min(2 * try_s, deadline - time.monotonic()))
        sess = _session(job, index, addr, graph, try_s)
        finished, error, _ = _bounded_run(sess, size, try_s, addr)
        if finished and error is None:
            sessions[f"{job}:{index}"] = (sess, op)
            return
        time.sleep(0.2)


def _tell(job, index, addr, code, deadline, status, connected):
    """Phase 2: enqueue ``code`` on one task's queue; tries again until ``deadline``; sets ``status``.

    Every try is bounded on its own and, past the first, uses a new session,
    so a try that went wrong cannot use up the budget or leave the next one a
    broken session. Each try may take twice as long as the one before (3 s,
    6 s, ...): a slow but healthy task still answers one. A released task
    exits at once, often before its answer reaches the chief (gRPC then
    retries on the closed socket until the try's deadline): the port closing
    while a try is out says the message arrived. An extra enqueue after a try
    that did arrive is harmless: the queue has spare slots and the task reads
    one code.
    """
    name, tried, last, try_s = f"{job}:{index}", False, "no answer", FIRST_TRY_SECONDS / 2
    graph, op, _ = _graph(job, index, code)
    while time.monotonic() < deadline:
        if not port_open(addr):    # it left after a try, or before any (nothing to tell)
            status[name] = "left" if tried else "gone"
            return
        try_s = max(0.1, min(2 * try_s, deadline - time.monotonic()))
        if connected is not None:          # the session phase 1 made: no new device lookup
            finished, error, closed = _bounded_run(*connected, try_s, addr)
            connected = None
        else:
            finished, error, closed = _bounded_run(_session(job, index, addr, graph, try_s), op, try_s, addr)
        tried = True
        if closed:
            status[name] = "left"
            return
        if finished and error is None:
            status[name] = "released"
            return
        last = error or last
        time.sleep(0.2)
    status[name] = f"unreached: {last}"


_KEEP = []


def never_close(session):
    """Keep ``session`` referenced until hard_exit, so its __del__ never closes it.

    Closing a distributed session is a round of RPCs to every task it touched
    (and MonitoredSession first waits for its threads); nothing depends on it
    once the results are written and the PS tasks are told to leave.
    """
    _KEEP.append(session)
    return session


def keep_until_exit(*objects):
    """Keep ``objects`` referenced until hard_exit: nothing they hold on another task is released
    by a ``__del__`` while the tasks are being told to leave."""
    _KEEP.extend(objects)


def hard_exit(code):
    """Leave without tearing down the gRPC server threads (TF cannot stop a Server cleanly)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
