"""Ring all-reduce's cost model, the family the all-reduce methods share (Horovod, bare MPI, MWMS and
local SGD declare a ``Ring`` in their method.py): the bytes each link carries per round, the exchange's
alpha-beta time and the wait-free step."""
from allreduce.backend import ring_share
from hvdps.cost import schedule
from hvdps.cost.model import combine, summed_rates_step


# The network a ring is costed on unless it declares one of its own, and the one the projection's
# generic ring all-reduce rows use (fitted from Horovod's measured collectives, horovod_train/method.py).
RING_NETWORK = "allreduce"


class Ring:
    """Ring all-reduce: every rank sends and receives 2(n-1)/n of each dense tensor per step,
    rank to rank (no server). ``dense_modes``: the modes that all-reduce embedding tables whole
    (otherwise their slices are all-gathered, which is not the ring's rule: no link prediction).
    ``wait_free``: the exchange starts while back-propagation runs (Horovod's background thread and
    fusion, played out by schedule.ring_step); otherwise one all-reduce after it. ``network``: the
    fit of latency and bandwidth the projection costs it with (hvdps/cost/projection.py: ``allreduce``,
    fitted from Horovod's measured collectives, or a family of its own such as TensorFlow's ring),
    where no flag or emulated cluster gives every method the same network; ``measured``: the
    ``Network`` comm.json's rows of this method fit (None: costed with another's). ``polls``: its ranks spin
    while they wait (Open MPI's progress loop, Horovod's background thread), so the busy share of the
    cores measures their waiting, not their work (hvdps/cost/heldout.py fits no cores floor for it).
    ``options``: the knobs of the implementation it declares (``Option``); a wait-free ring reads its
    fusion buffer and cycle off ``tuning`` (``fusion_bytes``, ``cycle_s``), which its method declares."""
    collective = True       # no server tasks; one worker alone exchanges nothing
    # the link each step term crosses (hvdps/cost/stragglers.py: "own", "server"); a ring's one term
    # moves at the pace of the slowest link among its ranks, the default for a term not named
    link_terms = {}
    arch = "ring"           # the projection's architecture this method is measured against
    # Every update is the all-ranks average of that step's gradients, so one exact ring is a drop-in
    # for another: the crossover's ring side is the fastest of them. A ring method that is not exact
    # (local SGD: weights averaged every k steps) is set against them instead, and the projection
    # draws it on rows of its own even where it shares the ring's network.
    exact = True

    def lockstep(self, mode):
        """Every rank computes at the same moment each step (they all wait for the all-reduce)."""
        return True

    def waits_for(self, mode, workers):
        """How many workers a step waits for (None: none, each at its own pace): a ring, every rank."""
        return workers

    def unwaited_step(self, mode, steps, terms=None):
        """Seconds a round of the n workers' steps takes where no step waits for the others
        (``waits_for`` None), each at its own ``steps`` (``terms``: each worker's step terms, for a
        method whose round also depends on what crosses one worker's link): n over their summed
        rates. A ring always waits; this is the rule every unwaited method shares."""
        return summed_rates_step(steps)

    def steps_per_exchange(self, mode):
        """How many steps one exchange serves: every step's gradient is all-reduced."""
        return 1

    def wait_points(self, mode, workers):
        """How many times a step a rank waits for its neighbour's data and then must act on it: the
        ring's 2(n - 1) transfers (reduce-scatter, then all-gather), once per exchange."""
        return 2 * (workers - 1) / self.steps_per_exchange(mode)

    def continues_without(self, mode, workers, terms):
        """Seconds of a step (``terms``: ``step_terms``) the other workers' exchange goes on while one
        worker is stopped: none in a ring, whose every transfer needs every rank."""
        return 0.0

    def __init__(self, dense_modes=("sync",), wait_free=False, how=None, network=None, polls=False,
                 measured=None, options=()):
        self.dense_modes, self.wait_free, self.network = tuple(dense_modes), wait_free, network or RING_NETWORK
        self.polls, self.measured, self.options = polls, measured, tuple(options)
        self.how = how or ("ring, wait-free schedule of the layers" if wait_free
                           else "ring Allreduce after back-propagation")

    def dense(self, mode):
        """Whether ``mode`` all-reduces embedding tables whole (else their slices are all-gathered)."""
        return mode in self.dense_modes

    @property
    def schedules(self):
        """A wait-free ring's step is played out layer by layer (its fusion buffer and cycle)."""
        return self.wait_free

    panel = "ring all-reduce"      # the projection's panel for this family, and its generic row's name

    def generic_rows(self, layers, compute_s, n, nets, tuning, shards=(1,), per_server=1):
        """[(label, Scheduled)]: the projection's generic row of the ring at n workers, this model's
        schedule on its network."""
        return [(self.panel, self.schedule(layers, compute_s, n, self.net(nets), tuning))]

    def generic_exchange_s(self, n, grad, nets, shards=1, per_server=1):
        """The alpha-beta time of the ring's exchange of ``grad`` bytes: what a run's measured overlap
        is applied to in the projection."""
        net = self.net(nets)
        return schedule.ring_allreduce_time(n, grad, net.bandwidth, net.alpha)

    def schedule(self, layers, compute_s, n, net, tuning, **layout):
        """One step on ``net`` as the wait-free ring plays it out (schedule.ring_step): the layers'
        gradients packed into fusion buffers each background cycle, with the fusion buffer and cycle
        its method declares (``tuning.fusion_bytes``, ``tuning.cycle_s``)."""
        return schedule.ring_step(layers, compute_s, n, net.bandwidth, net.alpha, tuning.fusion_bytes, tuning.cycle_s)

    def predict_links(self, mode, roles, gradient, shard_bytes=None):
        """{host: {"in", "out"}} bytes per round: each host with a rank carries the ring's share of
        the dense gradient (tables whole) both ways; a job on one host crosses no link."""
        dense, sparse, table = (getattr(gradient, k) or 0 for k in ("dense_bytes", "sparse_bytes", "sparse_table_bytes"))
        if sparse and not self.dense(mode):
            return None
        hosts = {h: {"in": 0.0, "out": 0.0} for h in dict.fromkeys(roles.values())}
        ranks = [h for t, h in roles.items() if t.startswith("rank:")]
        ring = ring_share(len(ranks)) * (dense + table)
        used = set(ranks)
        for h in hosts:
            if h in used and len(used) > 1:
                hosts[h] = {"in": ring, "out": ring}
        return hosts

    def split_roles(self, roles):
        """(the hosts of its server tasks, its workers' hosts) of a job's {task: host}: a ring has no
        servers, and every rank is a worker."""
        return [], list(roles.values())

    def net(self, nets):
        """The latency and bandwidth this ring is costed with, of the projection's ``nets``
        ({network: AlphaBeta}): its own fit (``network``) where there is one, else the ring's."""
        return nets.get(self.network) or nets.get(RING_NETWORK)

    def exchange_s(self, row, nets):
        """The alpha-beta time of one step's exchange with the ring's fitted network."""
        grad, n, ring = row.grad_bytes_per_step, row.workers or 1, self.net(nets)
        if not grad or n < 2 or not ring:
            return None
        return schedule.ring_allreduce_time(n, grad, ring.bandwidth, ring.alpha)

    def projected_step(self, row, shard_bytes, layers, nets, tuning):
        terms = self.step_terms(row, shard_bytes, layers, nets, tuning)
        return (None, None) if terms is None else (combine(row.compute_s, terms), self.how)

    def step_terms(self, row, shard_bytes, layers, nets, tuning):
        """{term: (with compute, seconds)}: the step is the longest of compute (where counted) plus
        each term (``combine``). The ring has one: the exchange left after back-propagation."""
        n, compute, grad, ring = row.workers, row.compute_s, row.grad_bytes_per_step, self.net(nets)
        if self.wait_free:
            return {"ring": (True, self.schedule(layers, compute, n, ring, tuning).step_s - compute)}
        if not grad:
            return None
        return {"ring": (True, schedule.ring_allreduce_time(n, grad, ring.bandwidth, ring.alpha))}


