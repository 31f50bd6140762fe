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
This plays the rules out over each worker's step (its mean: token to push), not a measurement.
"""
import heapq

WARMUP, UPDATES = 16, 240        # updates before the measured ones, and the measured ones (240: whole periods of 2-6)


def update_interval(steps, replicas):
    """Seconds per update of a job whose workers take ``steps`` seconds from a token to their next
    push and whose updates take ``replicas`` (R) fresh gradients: the mean over ``UPDATES`` updates
    after ``WARMUP``, the queue's start-up left out."""
    n = len(steps)
    if not 1 <= replicas <= n or any(s <= 0 for s in steps):
        raise ValueError(f"replicas must be in [1, {n}] and every step positive, got {replicas}, {steps}")
    events = [(s, i) for i, s in enumerate(steps)]      # (push time, worker)
    heapq.heapify(events)
    local, queue, waiting = [0] * n, [], []
    update = fresh = 0
    times = []
    while len(times) < WARMUP + UPDATES + 1:
        if not events:                         # every worker at an empty queue: the rules above exclude it
            raise RuntimeError(f"token queue stalled after update {update}")
        now, i = heapq.heappop(events)
        if local[i] >= update:                 # the accumulator keeps it; a stale one is dropped
            fresh += 1
            if fresh == replicas:              # the chief applies the update, then N tokens
                update, fresh = update + 1, 0
                times.append(now)
                queue.extend([update] * n)
                while waiting and queue:
                    j = waiting.pop(0)
                    local[j] = queue.pop(0)
                    heapq.heappush(events, (now + steps[j], j))
        if queue:
            local[i] = queue.pop(0)
            heapq.heappush(events, (now + steps[i], i))
        else:
            waiting.append(i)
    return (times[-1] - times[WARMUP]) / UPDATES
