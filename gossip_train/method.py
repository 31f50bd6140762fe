"""What hvdps knows of gossip SGD (collected by hvdps/methods.py): one mode, the ring topology; the
same mpirun line as the other MPI trainers with this package's trainer; a cost model of its own, two
neighbour messages of the whole model per step whatever the number of workers; and the report's
wording. It is not an exact all-reduce (the ranks' weights agree only in the limit), so the
projection draws it on rows of its own and the crossover beside the exact rings, not among them."""
from hvdps.cost.ring import Ring
from hvdps.launchers import MPIRunLauncher
from hvdps.methods import Method
from gossip_train.backend import gossip_wire, neighbours


class GossipLauncher(MPIRunLauncher):
    """mpirun with this package's trainer."""
    main = ("gossip_train", "main.py")


class GossipRing(Ring):
    """D-PSGD on a ring: after its compute, each rank sends its whole model to each neighbour and
    receives theirs (one MPI_Neighbor_allgather; both neighbours' messages cross the rank's link at
    once), a latency and the model's bytes times the neighbours over the bandwidth. The ring
    all-reduce sends 2(n-1)/n of the model in 2(n-1) latencies, so gossip loses on bytes (2 against
    under 2 at n >= 3, 1 against 1 at n = 2) and wins on latencies as n grows. It reads the ring's
    fit of the network (the same MPI over the same links) and overlaps nothing with back-propagation."""
    exact = False

    def __init__(self):
        super().__init__(polls=True, how="the whole model to each ring neighbour after back-propagation")

    def dense(self, mode):
        return True                        # the weights are exchanged, embedding tables whole

    def wait_points(self, mode, workers):
        """One neighbourhood collective a step: a rank waits once, for its neighbours' weights."""
        return 1.0 if workers > 1 else 0.0

    def predict_links(self, mode, roles, gradient, shard_bytes=None):
        """{host: {"in", "out"}} bytes per step: each rank's model to each neighbour on another host."""
        model = sum(getattr(gradient, k) or 0 for k in ("dense_bytes", "sparse_table_bytes"))
        ranks = {int(t.split(":", 1)[1]): h for t, h in roles.items() if t.startswith("rank:")}
        hosts = {h: {"in": 0.0, "out": 0.0} for h in dict.fromkeys(roles.values())}
        for rank, host in ranks.items():
            for peer in neighbours(rank, len(ranks)):
                if ranks[peer] != host:
                    hosts[host]["out"] += model
                    hosts[ranks[peer]]["in"] += model
        return hosts

    def exchange_s(self, row, nets):
        grad, n, net = row.grad_bytes_per_step, row.workers or 1, self.net(nets)
        if not grad or n < 2 or not net:
            return None
        sizes = {"dense_bytes": grad, "sparse_table_bytes": 0}
        return net.alpha + gossip_wire(sizes, n)["bytes_per_step_per_worker"] / net.bandwidth

    def step_terms(self, row, shard_bytes, layers, nets, tuning):
        if not row.grad_bytes_per_step or not self.net(nets):
            return None
        return {"neighbour exchange": (True, self.exchange_s(row, nets) or 0.0)}   # alone: no neighbour


METHODS = (
    Method("gossip", {"ring": "gossip SGD (ring)"}, GossipLauncher, GossipRing(),
           overhead={"ring": "averaging the weights with the ring neighbours (one MPI_Neighbor_allgather) "
                             "and waiting for the slower of them"},
           alone={"ring": "the MPI calls with no neighbour to average with (one worker: no traffic)"},
           exchange_timed="MPI_Neighbor_allgather"),
)
