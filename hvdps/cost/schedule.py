"""Wait-free back-propagation: how much of the gradient exchange hides behind the backward pass.

Back-propagation produces gradients from the last layer to the first. A
layer's gradient can travel as soon as it exists, while earlier layers are
still being differentiated (Poseidon's "wait-free backprop"; Horovod and TF's
PS runtime both do it). What cannot hide is the exchange of what becomes
ready last, plus any queue that built up behind the network. This module
plays that schedule out, layer by layer, from a model's per-layer gradient
sizes and FLOPs (common/model/layer_profile.py) and an alpha-beta network:

- backward time of a layer is its share of the model's forward FLOPs times the
  backward time (a third of a step is forward, two thirds backward: the usual
  1:2 ratio of forward to backward work);
- ring all-reduce as Horovod runs it: a background thread wakes every
  ``cycle_s``, takes every gradient that is ready, packs them into fusion
  buffers of at most ``fusion_bytes`` and all-reduces the buffers one after
  another (the next cycle starts when the last reduction ends); each buffer of
  m bytes costs the ring time 2(n-1)/n m/B + 2(n-1) alpha;
- parameter servers (TF's between-graph PS): each gradient is pushed as soon as
  it is ready (no fusion), the k PS shards share the bytes evenly, and the
  variables are pulled back before the next forward pass uses them, in layer
  order, each layer's forward waiting for its own variables.

Step time = forward + backward + the exposed exchange; efficiency = compute /
step, as tf_cnn_benchmarks' scaling figures are (per-GPU throughput at n over
the single-GPU throughput).
"""
import dataclasses
from statistics import NormalDist

from allreduce.backend import ring_share
from common.trainer.backend import MIN_SHARD_BYTES

FORWARD_SHARE = 1.0 / 3.0


@dataclasses.dataclass(frozen=True)
class AlphaBeta:
    """A network as every formula here takes it: ``alpha`` seconds per message, ``bandwidth`` bytes/s
    achievable. Fitted from comm.json (hvdps/cost/projection.py: ``fit_from_comm``), or given by
    flags or an emulated cluster's links (hvdps/commands/project.py: ``network``)."""
    alpha: float
    bandwidth: float


@dataclasses.dataclass(frozen=True)
class Scheduled:
    """One step played out: its time, the exchange's own time, what of the step the exchange added
    past compute (exposed), the messages it took (fusion buffers, or PS pushes and pulls) and the
    share of the exchange hidden behind back-propagation."""
    step_s: float
    comm_s: float
    exposed_s: float
    buffers: int
    overlap: float


@dataclasses.dataclass(frozen=True)
class Unfitted:
    """A network comm.json measured whose points could not be fitted, and why: refused in one line
    where the projection would use it."""
    error: str


def ring_allreduce_time(n, nbytes, bandwidth, alpha):
    """One ring all-reduce of ``nbytes`` among n ranks: 2(n-1)/n M/B + 2(n-1) alpha."""
    if n <= 1:
        return 0.0
    return ring_share(n) * nbytes / bandwidth + 2.0 * (n - 1) * alpha


def ps_time(n, nbytes, bandwidth, alpha, shards=1, per_server=1, ps_bandwidth=None):
    """One push and one pull of ``nbytes`` by each of n workers through ``shards`` PS tasks: each
    direction takes the busier of a PS link (n M / k at ``ps_bandwidth``) and a server's own link
    (its ``per_server`` workers' M), plus one alpha."""
    ps_bw = ps_bandwidth or bandwidth
    per_dir = max(n * nbytes / (shards * ps_bw), min(per_server, n) * nbytes / bandwidth)
    return 2.0 * per_dir + 2.0 * alpha


def backward_ready_times(layers, backward_s):
    """(time from the start of the backward pass, bytes) of each gradient, in the order they appear."""
    total = float(sum(x.flops for x in layers)) or 1.0
    t, out = 0.0, []
    for layer in reversed(layers):
        t += backward_s * layer.flops / total
        out.append((t, layer.grad_bytes))
    return out


def ring_step(layers, compute_s, n, bandwidth, alpha, fusion_bytes=64 << 20, cycle_s=5e-3,
              forward_share=FORWARD_SHARE):
    """Step time of synchronous ring all-reduce with Horovod's tensor fusion and cycle time.

    Returns a dict: step_s, comm_s (all exchange time, hidden or not),
    exposed_s (step - compute), buffers (collectives per step) and
    overlap (the share of the exchange hidden behind the backward pass).
    """
    fwd = compute_s * forward_share
    bwd = compute_s - fwd
    ready = backward_ready_times(layers, bwd)
    if n <= 1:
        return Scheduled(step_s=compute_s, comm_s=0.0, exposed_s=0.0, buffers=0, overlap=0.0)
    i, now, comm, buffers = 0, 0.0, 0.0, 0
    while i < len(ready):
        # the next cycle: one cycle after the previous started, not before the previous ops ended,
        # and (a thread with nothing to do sleeps) not before the next gradient exists
        now = max(now + cycle_s, ready[i][0]) if buffers else max(cycle_s, ready[i][0])
        batch = []
        while i < len(ready) and ready[i][0] <= now:
            batch.append(ready[i][1])
            i += 1
        for size in _fuse(batch, fusion_bytes):
            t = ring_allreduce_time(n, size, bandwidth, alpha)
            now += t
            comm += t
            buffers += 1
    end = max(bwd, now)
    step = fwd + end
    return Scheduled(step_s=step, comm_s=comm, exposed_s=step - compute_s, buffers=buffers,
                     overlap=_overlap(comm, step - compute_s))


def _fuse(sizes, threshold):
    """Greedy packing in ready order, as Horovod's fusion does; a tensor over the threshold goes alone."""
    out, cur = [], 0
    for s in sizes:
        if cur and (threshold <= 0 or cur + s > threshold):
            out.append(cur)
            cur = 0
        cur += s
    if cur:
        out.append(cur)
    return out


def _overlap(comm, exposed):
    return max(0.0, min(1.0, 1.0 - exposed / comm)) if comm > 0 else 0.0


PLACEMENTS = ("split", "round_robin", "greedy")


def place_variables(layers, shards, placement="greedy"):
    """Bytes per PS shard, and each layer's [(shard, bytes)], as TF places variables in creation order.

    ``round_robin`` is tf.compat.v1.train.replica_device_setter's default: one
    shard after another, so a model with one huge variable (VGG-16's first
    dense kernel, 411 MB) loads one PS far more than the rest. ``greedy`` is
    GreedyLoadBalancingStrategy by byte size (each variable to the least
    loaded shard), what tf_cnn_benchmarks' distributed PS mode uses. ``split``
    is hvdps' PS trainers (both APIs): each tensor first cut into
    ceil(bytes / MIN_SHARD_BYTES) pieces, at most one per shard (TensorFlow's
    min_max_variable_partitioner; taken as equal pieces), the pieces then
    round robin.
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r} (valid: {', '.join(sorted(PLACEMENTS))})")
    loads, shard_of, j = [0] * max(shards, 1), [], 0
    for layer in layers:
        mine = []
        for size in layer.tensors or [layer.grad_bytes]:
            pieces = min(len(loads), max(1, -(-size // MIN_SHARD_BYTES))) if placement == "split" else 1
            for piece in [size // pieces + (1 if i < size % pieces else 0) for i in range(pieces)]:
                k = j % len(loads) if placement != "greedy" else min(range(len(loads)), key=loads.__getitem__)
                loads[k] += piece
                mine.append((k, piece))
                j += 1
        shard_of.append(mine)
    return loads, shard_of


def ps_step(layers, compute_s, n, bandwidth, alpha, shards=1, per_server=1, placement="greedy", towers=1,
            forward_share=FORWARD_SHARE):
    """Step time of a synchronous PS cluster: push as gradients appear, pull before the forward pass.

    Variables sit on the k shards as ``placement`` puts them (place_variables).
    A shard's link receives every worker task's copy of its variables'
    gradients (n m / B for a tensor of m bytes with one task per GPU) and each
    server's link carries its own tasks' copies; each shard and each server
    link is a FIFO queue, and a tensor is through when both are. ``towers``
    GPUs driven by one worker task (tf_cnn_benchmarks' --num_gpus) move one
    copy for all of them: its parameter_server mode sums the towers' gradients
    on the worker's CPU before the push (add_n under replica_device_setter's
    worker device) and caches each variable once per task, so push and pull
    both move n/towers copies. The pull starts after the last push
    (synchronous training: variables change when every push is in) and a
    layer's forward pass waits for its own variables. Aggregation on the PS
    CPUs is not modelled: this is the network-bound step; give ``bandwidth``
    the rate the PS transport really reaches (gRPC's, not the link's) where
    they differ.

    comm_s is the busiest link's transfer time (push + pull), so overlap says
    how much of that link's work the backward and forward passes hide.
    """
    if n <= 0 or towers <= 0:
        raise ValueError("workers and towers must be >= 1")
    fwd = compute_s * forward_share
    bwd = compute_s - fwd
    g = min(per_server, n)
    towers = min(towers, n)
    copies, local = n / towers, max(1.0, g / towers)    # worker tasks in all, and on one server
    k = max(shards, 1)
    _, shard_of = place_variables(layers, k, placement)
    ready = backward_ready_times(layers, bwd)
    busy = [0.0] * (k + 1)                      # per shard link, then the server link

    def transfer(t0, placed, free, copies, local):
        done = t0
        for j, size in placed:
            free[j] = max(free[j], t0) + copies * size / bandwidth + alpha
            free[k] = max(free[k], t0) + local * size / bandwidth + alpha
            busy[j] += copies * size / bandwidth + alpha
            busy[k] += local * size / bandwidth + alpha
            done = max(done, free[j], free[k])
        return done

    free = [0.0] * (k + 1)
    push_end = bwd
    for (t_ready, _), placed in zip(ready, reversed(shard_of)):
        push_end = max(push_end, transfer(t_ready, placed, free, copies, local))
    total = float(sum(x.flops for x in layers)) or 1.0
    free = [push_end] * (k + 1)
    computed = push_end
    for layer, placed in zip(layers, shard_of):
        arrived = transfer(push_end, placed, free, copies, local)
        computed = max(computed, arrived) + fwd * layer.flops / total
    step = computed
    comm = max(busy)
    return Scheduled(step_s=step, comm_s=comm, exposed_s=step - compute_s,
                     buffers=2 * sum(len(p) for p in shard_of), overlap=_overlap(comm, step - compute_s))


def byteps_link_scale(n, k):
    """How many times faster than a ring's the exchange of n workers with k extra CPU-only servers is
    (BytePS, OSDI'20, section 3.1): it moves 2n(n-1)M/((n^2 + kn - 2k)B), all-reduce's 2(n-1)M/(nB)
    at k = 0 and M/B (every byte crosses each worker's link once each way) at k = n; so the ring's
    schedule on a link (n^2 + kn - 2k)/n^2 times faster."""
    return (n * n + k * n - 2 * k) / float(n * n) if n > 1 else 1.0
