"""SyncReplicasOptimizer's token queue played out: how fast a sync job with backup workers updates.

TensorFlow's backup workers are not the textbook's (Chen et al. 2016, where every worker starts each
update and the job keeps the (N - K)-th fastest worker's pace). Its rules
(tensorflow/python/training/sync_replicas_optimizer.py, as hvdps' PS trainer runs it: no spare
tokens at the start):

- a worker pushes its gradient tagged with its local step; the accumulator keeps it only if that
  step is the current update's (a stale one is dropped);
- once R = N - K gradients are kept, the chief applies them and enqueues N tokens, each the new
  global step;
- after each push the worker takes the next token from the FIFO queue (or waits for one) and makes
  it its local step, so a fast worker also takes a slow one's tokens, stale ones included.

With two workers and one backup that makes the job's updates the workers' summed rate over N
(each update takes a push from each of its N tokens); with more workers a fast worker that drew a
stale token can wait at an empty queue for the slow one's push, and the job is slower than that.
The chief applies each update from a queue runner: a session.run that returns once the update's
tokens are queued, after which its next run starts the next update's wait on the PS. Two updates are
therefore at least that round trip (``apply_s``) apart, however many fresh gradients are waiting.
This plays the rules out over each worker's step (its mean: token to push), not a measurement.
"""
import heapq

WARMUP, UPDATES = 16, 240        # updates before the measured ones, and the measured ones (240: whole periods of 2-6)


def update_interval(steps, replicas, apply_s=0.0):
    """Seconds per update of a job whose workers take ``steps`` seconds from a token to their next
    push, whose updates take ``replicas`` (R) fresh gradients and come at least ``apply_s`` apart (the
    chief's round trip to the PS between two updates): the mean over ``UPDATES`` updates after
    ``WARMUP``, the queue's start-up left out."""
    n = len(steps)
    if not 1 <= replicas <= n or any(s <= 0 for s in steps) or not apply_s >= 0:
        raise ValueError(f"replicas must be in [1, {n}], every step positive and the apply's round trip "
                         f"not negative, got {replicas}, {steps}, {apply_s}")
    events = [(s, i) for i, s in enumerate(steps)]      # (time, worker): a push; worker -1: the chief applies
    heapq.heapify(events)
    local, queue, waiting = [0] * n, [], []
    update = fresh = 0
    ready, pending = 0.0, False          # when the chief can next apply; an apply already on its way
    times = []
    while len(times) < WARMUP + UPDATES + 1:
        if not events:                         # every worker at an empty queue: the rules above exclude it
            raise RuntimeError(f"token queue stalled after update {update}")
        now, i = heapq.heappop(events)
        if i < 0:                              # the chief applies the R fresh gradients, then N tokens
            update, fresh, pending, ready = update + 1, 0, False, now + apply_s
            times.append(now)
            queue.extend([update] * n)
            while waiting and queue:
                j = waiting.pop(0)
                local[j] = queue.pop(0)
                heapq.heappush(events, (now + steps[j], j))
            continue
        if local[i] >= update:                 # the accumulator keeps it; a stale one is dropped
            fresh += 1
        if fresh >= replicas and not pending:  # R are in: the chief applies once its round trip is back
            pending = True
            heapq.heappush(events, (max(now, ready), -1))
        if queue:
            local[i] = queue.pop(0)
            heapq.heappush(events, (now + steps[i], i))
        else:
            waiting.append(i)
    return (times[-1] - times[WARMUP]) / UPDATES
