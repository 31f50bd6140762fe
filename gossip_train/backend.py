"""Decentralized parallel SGD (D-PSGD: Lian, Zhang, Zhang, Hsieh, Zhang and Liu, "Can Decentralized
Algorithms Outperform Centralized Algorithms?", NeurIPS 2017) on a ring of ranks.

Every rank steps on its own gradient, then averages its weights with its two neighbours on the ring
(one third each: the ring's doubly stochastic mixing matrix; at two ranks the one neighbour, one half
each). The neighbours' weights come with one ``MPI_Neighbor_allgather`` over a distributed graph
topology (``MPI_Dist_graph_create_adjacent``): MPI's own neighbourhood collective, nothing
hand-written. No rank waits for any rank but its neighbours, and what a rank sends per step does not
grow with the number of ranks: the whole model to each neighbour.

The ranks' weights differ between steps (they only agree in the limit), so an evaluation evaluates
their average, as the paper does, and the run's last step ends in one exact average (one
``MPI_Allreduce``) so the model it saves is that average. The loop, the books and the metrics are the
other all-reduce trainers' (allreduce/sync_loop.py); this backend says where the exchange happens:
after the step (``after_step``), not inside it.
"""
import contextlib
import time

import numpy as np

from allreduce.mpi import MPIJob


def neighbours(rank, size):
    """The ranks ``rank`` exchanges with on a ring of ``size``: left and right, the one other rank
    at two, none alone."""
    if size < 2:
        return []
    if size == 2:
        return [1 - rank]
    return [(rank - 1) % size, (rank + 1) % size]


def gossip_wire(sizes, workers):
    """What a rank sends (and receives) per step: its whole model (the dense weights, embedding
    tables whole) to each neighbour. The one place gossip's volume is written: the trainer's wire
    rule and the cost model's link prediction use it."""
    model = sizes["dense_bytes"] + sizes["sparse_table_bytes"]
    degree = len(neighbours(0, workers))
    return {"bytes_per_step_per_worker": int(degree * model),
            "wire_rule": f"gossip SGD on a ring: the whole model to each of {degree} neighbour(s) per step per worker"}


class GossipBackend(MPIJob):
    name = "gossip"
    mode = "ring"

    def __init__(self):
        super().__init__()
        self.graph = None
        self.in_step = True                # the ranks hold the same weights (after the start's broadcast)
        self._mixings = {}

    def setup(self, cfg):
        super().setup(cfg)
        peers = neighbours(self.rank, self.world_size)
        if peers:                           # Gossip: the ring as an MPI distributed graph topology
            self.graph = self.comm.Create_dist_graph_adjacent(peers, peers, reorder=False)
        return self

    def wrap_tape(self, tape):
        return tape                        # Gossip: each rank steps on its own gradient

    def wire_bytes(self, sizes, plan):
        return gossip_wire(sizes, self.world_size)

    def after_step(self, model, step, last):
        """After every step the weights are mixed with the neighbours'; after the run's last, averaged
        over every rank, so the model the run ends with is the ranks' average."""
        if self.world_size < 2:
            return
        self._traced(model, "mix", self._mix)()
        if last:
            self._traced(model, "average", self._average)()
        self.in_step = last

    @contextlib.contextmanager
    def consensus(self, model):
        """An evaluation evaluates the ranks' average; the ranks then go on from their own weights."""
        if self.in_step or self.world_size < 2:
            yield
            return
        own = [w.numpy() for w in model.trainable_weights]
        self._traced(model, "average", self._average)()
        try:
            yield
        finally:
            for w, value in zip(model.trainable_weights, own):
                w.assign(value)

    def _mix(self, flat):
        """This rank's weights and its neighbours' (one MPI_Neighbor_allgather), averaged: timed into
        ``exchange_times``, the run's exchange."""
        got = np.empty((self.graph.Get_dist_neighbors_count()[0], flat.size), dtype=flat.dtype)
        t0 = time.perf_counter()
        self.graph.Neighbor_allgather(flat, got)
        self.exchange_times.append(time.perf_counter() - t0)
        return (flat + got.sum(axis=0)) / np.float32(1 + len(got))

    def _average(self, flat):
        """Every rank's weights averaged (one MPI_Allreduce): an evaluation's or the run's end, not the
        per-step exchange, so not timed."""
        out = np.empty_like(flat)
        self.comm.Allreduce(flat, out, op=self.MPI.SUM)
        return out / np.float32(self.world_size)

    def _traced(self, model, key, combine):
        """A traced function that replaces ``model``'s trainable weights by ``combine`` of one fused
        float32 buffer of them, split back and assigned in the graph (as local SGD averages its
        weights: one traced call, not a Python round trip per variable)."""
        if key not in self._mixings:
            import tensorflow as tf
            weights = list(model.trainable_weights)
            sizes = [int(np.prod(w.shape)) for w in weights]

            def run():
                flat = tf.concat([tf.reshape(tf.cast(w, tf.float32), [-1]) for w in weights], 0)
                mixed = tf.numpy_function(combine, [flat], tf.float32, stateful=True, name=f"gossip_{key}")
                mixed = tf.ensure_shape(mixed, flat.shape)
                for w, part in zip(weights, tf.split(mixed, sizes)):
                    w.assign(tf.cast(tf.reshape(part, w.shape), w.dtype))
            self._mixings[key] = tf.function(run, autograph=False)
        return self._mixings[key]

    def summary_extra(self):
        """The measured exchange per step: the median neighbour exchange after the warm-up's."""
        times = self.exchange_times[self.warmup_steps:] or self.exchange_times
        seconds = float(np.median(times)) if times else None
        return {"exchange_s_per_step": seconds, "exchange_s": seconds, "mixings": len(self.exchange_times),
                "neighbours": len(neighbours(self.rank, self.world_size))}
