"""What hvdps knows of the parameter-server methods this package trains (collected by
hvdps/methods.py): classic between-graph PS (``ps``, async and sync) and TensorFlow 2's
ParameterServerStrategy (``ps2``), both started by ``python -m ps_train.launch``, costed as
parameter servers, with the report's wording and the wait the sync trainer measures."""
from hvdps.cost import schedule
from hvdps.launchers import TaskLauncher
from hvdps.methods import Method, combine


class ParameterServers:
    """Parameter servers: each worker pushes its gradient and pulls the weights every batch; a PS
    task carries its share of every worker's bytes (by the bytes it holds, header ``ps_shard_bytes``,
    else evenly). Synchronous: every worker pushes, then every worker pulls; asynchronous: each
    worker at its own pace, the busiest PS link shared by all."""
    collective = False
    arch = "PS k=1"
    network = "ps"
    polls = False            # gRPC's threads block while they wait
    lockstep_modes = ("sync",)   # the workers wait for each other's gradients before each update

    def lockstep(self, mode):
        """Sync workers compute at the same moment each step; async ones each at their own pace."""
        return mode in self.lockstep_modes

    def predict_links(self, mode, roles, gradient, shard_bytes=None):
        dense, sparse = (getattr(gradient, k) or 0 for k in ("dense_bytes", "sparse_bytes"))
        hosts = {h: {"in": 0.0, "out": 0.0} for h in dict.fromkeys(roles.values())}
        workers = [h for t, h in roles.items() if t.startswith("worker:")]
        ps = {t: h for t, h in roles.items() if t.startswith("ps:")}
        model = dense + sparse
        total = sum((shard_bytes or {}).values())
        for task, ph in ps.items():
            share = (shard_bytes[task] / total) if total and task in (shard_bytes or {}) else 1 / len(ps)
            for wh in workers:
                if wh == ph:
                    continue
                moved = share * model
                for h in (wh, ph):
                    hosts[h]["out"] += moved
                    hosts[h]["in"] += moved
        return hosts

    def exchange_s(self, row, ring, ps):
        grad, n = row.grad_bytes_per_step, row.workers or 1
        if not grad or not ps:
            return None
        return schedule.ps_time(n, grad, ps["bandwidth"], ps["alpha"], row.num_ps or 1)

    def projected_step(self, row, shard_bytes, layers, ring, ps, fusion_bytes, cycle_s):
        """PS tasks on hosts of their own (hvdps compare's ``--ps_placement own``). Sync: push all,
        then pull all, through the busiest PS link (n·S/B each way) or a worker's own (M/B),
        whichever is slower: compute + 2·(max(nS, M)/B + alpha). Async: a worker pushes and pulls
        on its own link while the others do the same; the busiest PS link carries n·S each way
        per round: max(compute + 2·(M/B + alpha), n·S/B + alpha)."""
        terms = self.step_terms(row, shard_bytes, layers, ring, ps, fusion_bytes, cycle_s)
        if terms is None:
            return None, None
        how = "push all, then pull all" if self.lockstep(row.mode) else "own link or busiest PS link"
        return combine(row.compute_s, terms), how

    def step_terms(self, row, shard_bytes, layers, ring, ps, fusion_bytes, cycle_s):
        """{term: (with compute, seconds)}, the step being the longest (``combine``): a worker's own
        link (push M, then pull M, after its compute) and the busiest PS link (sync: every worker's
        push, then every pull, after the compute; async: n·S each way while the workers compute)."""
        n, grad = row.workers, row.grad_bytes_per_step
        if not grad:
            return None
        shards = (shard_bytes or {}).values()       # {PS task: model bytes it holds}, header ps_shard_bytes
        shard = max(shards) if shards else grad / (row.num_ps or 1)
        bw, alpha = ps["bandwidth"], ps["alpha"]
        busiest = n * shard / bw
        own = (True, 2 * (grad / bw + alpha))
        if self.lockstep(row.mode):
            return {"own link": own, "PS link": (True, 2 * (busiest + alpha))}
        return {"own link": own, "PS link": (False, busiest + alpha)}


class PSLauncher(TaskLauncher):
    """``python -m ps_train.launch``: the PS tasks and the workers, here or across --hosts."""
    module = "ps_train.launch"
    placement = True
    graph_mode = True

    def server_tasks(self, num_ps):
        return num_ps

    def launcher_argv(self, workers, mode, num_ps):
        return ["--num_ps", str(num_ps), "--num_workers", str(workers), f"--{mode or 'async'}"]


class PS2Launcher(PSLauncher):
    """TensorFlow 2's ParameterServerStrategy: the same launcher with ``--ps_api v2``; asynchronous
    only, and one more process, the chief that coordinates (it does not train)."""
    graph_mode = False
    trainer_flags = ("--ps_api", "v2")

    def server_tasks(self, num_ps):
        return num_ps + 1

    def launcher_argv(self, workers, mode, num_ps):
        return [*super().launcher_argv(workers, mode, num_ps), *self.trainer_flags]


METHODS = (
    Method("ps", {"async": "PS async", "sync": "PS sync"}, PSLauncher, ParameterServers(),
           overhead={"async": "pushing gradients to and pulling weights from the parameter servers",
                     "sync": "the PS round trip and waiting for the slower workers' gradients before each update"},
           waits={"sync": ("waiting for the other workers' gradients and the update (measured at the token queue)",
                           "the PS round trip and the rest")},
           waits_alone=("the update on the PS before the token comes back (one worker: no one else to wait for)",
                        "the PS round trip and the rest")),
    Method("ps2", {"async": "PS v2 (TF2 strategy)"}, PS2Launcher, ParameterServers(),
           overhead={"async": "the coordinator's dispatch and the PS round trip"}),
)
