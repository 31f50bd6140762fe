"""The wait-free back-propagation schedule against hand-computed steps."""
import pytest

from common.formats.schemas import Layer
from hvdps.cost import schedule as s
from hvdps.cost.schedule import ps_time, ring_allreduce_time


def layers(*pairs):
    """(grad_bytes, flops) per layer, in forward order."""
    return [Layer(name=f"l{i}", grad_bytes=int(b), tensors=[int(b)], flops=f) for i, (b, f) in enumerate(pairs)]


def test_ready_times_run_from_the_last_layer():
    # backward 2 s split by FLOPs 1:3 -> the last layer (3/4 of the work) is ready at 1.5 s, the first at 2 s
    assert s.backward_ready_times(layers((10, 1), (20, 3)), 2.0) == [(1.5, 20), (2.0, 10)]


@pytest.mark.parametrize("sizes, threshold, expected", [
    ([10, 10, 10], 25, [20, 10]),
    ([10, 10, 10], 0, [10, 10, 10]),          # fusion off: one collective per tensor
    ([30, 5], 25, [30, 5]),                   # over the threshold: alone
    ([5, 30], 64, [35]),
    ([], 64, []),
])
def test_fusion(sizes, threshold, expected):
    assert s._fuse(sizes, threshold) == expected


def test_one_tensor_nothing_hides():
    # a model known only by size: its gradient exists when backprop ends, the whole ring time is exposed
    one = layers((100e6, 1))
    res = s.ring_step(one, 3.0, 8, 1e9, 1e-5, cycle_s=0.0)
    assert res.step_s == pytest.approx(3.0 + ring_allreduce_time(8, 100e6, 1e9, 1e-5))
    assert res.overlap == pytest.approx(0.0) and res.buffers == 1


def test_big_last_layer_hides_behind_the_rest_of_backprop():
    # compute 3 s: forward 1, backward 2; the last layer's 100 MB is ready at 1 s into backward and
    # takes 0.1 s on the ring, long before the first layer (1 KB) is ready at 2 s
    two = layers((1000, 1), (100e6, 1))
    res = s.ring_step(two, 3.0, 2, 1e9, 0.0, cycle_s=0.0)
    assert res.step_s == pytest.approx(3.0 + ring_allreduce_time(2, 1000, 1e9, 0.0))
    assert res.overlap > 0.99 and res.buffers == 2


def test_cycle_time_delays_and_fuses():
    many = layers(*[(1e6, 1)] * 50)
    fast = s.ring_step(many, 1.0, 4, 1e9, 1e-5, cycle_s=0.0)
    slow = s.ring_step(many, 1.0, 4, 1e9, 1e-5, cycle_s=0.1)
    assert slow.buffers < fast.buffers == 50       # a longer cycle collects more tensors per buffer
    assert slow.step_s > fast.step_s


def test_single_worker_has_no_exchange():
    res = s.ring_step(layers((1e6, 1)), 0.5, 1, 1e9, 1e-5)
    assert res.step_s == 0.5 and res.comm_s == 0.0


@pytest.mark.parametrize("tensors, placement, loads", [
    ([3, 1, 1, 1], "round_robin", [4, 2]),
    ([3, 1, 1, 1], "greedy", [3, 3]),
    ([100, 1, 1, 1], "round_robin", [101, 2]),
    ([100, 1, 1, 1], "greedy", [100, 3]),
    # hvdps' trainers: a tensor over MIN_SHARD_BYTES (1 KiB) cut in one piece per shard, pieces round robin
    ([3, 1, 1, 1], "split", [4, 2]),
    ([40001, 1, 1, 1], "split", [20001 + 1 + 1, 20000 + 1]),
    ([12000, 16384, 4096, 1000], "split", [6000 + 8192 + 2048 + 1000, 6000 + 8192 + 2048]),
])
def test_placement(tensors, placement, loads):
    got, shard_of = s.place_variables(layers(*[(t, 1) for t in tensors]), 2, placement)
    assert got == loads and [j for mine in shard_of for j, _ in mine][0] == 0


def test_placement_rejects_unknown():
    with pytest.raises(ValueError, match="valid: greedy, round_robin, split"):
        s.place_variables(layers((1, 1)), 2, "random")


@pytest.mark.parametrize("n, k, g", [(1, 1, 1), (4, 1, 1), (8, 2, 4), (8, 8, 4)])
def test_ps_with_one_tensor_is_the_alpha_beta_cost(n, k, g):
    # one tensor split over k shards is still one tensor here: it sits on one shard, so the push
    # and the pull each cost max(n M, g M)/B + alpha, nothing overlaps, and with k = 1 that is ps_time
    res = s.ps_step(layers((100e6, 1)), 3.0, n, 1e9, 1e-5, shards=k, per_server=g)
    per_dir = max(n, min(g, n)) * 100e6 / 1e9 + 1e-5
    assert res.step_s == pytest.approx(3.0 + 2 * per_dir)
    if k == 1:
        assert res.step_s == pytest.approx(3.0 + ps_time(n, 100e6, 1e9, 1e-5, 1, g))


@pytest.mark.parametrize("n, towers, per_server, tasks", [(8, 1, 1, 8), (8, 4, 4, 2), (8, 8, 8, 1), (2, 4, 4, 1)])
def test_ps_push_and_pull_once_per_worker_task(n, towers, per_server, tasks):
    # tf_cnn_benchmarks sums a task's towers on its CPU and caches each variable once per task:
    # the shard's link moves one copy per worker task each way, not one per GPU
    res = s.ps_step(layers((100e6, 1)), 3.0, n, 1e9, 0.0, shards=1, per_server=per_server, towers=towers)
    assert res.step_s == pytest.approx(3.0 + 2 * tasks * 0.1)


@pytest.mark.parametrize("n, k, expected", [
    (8, 0, ring_allreduce_time(8, 1e8, 1e9, 0.0)),     # no servers: the all-reduce bound
    (8, 8, 0.1),                                        # k = n: M/B
    (2, 1, 2 * 2 * 1 * 0.1 / (4 + 2 - 2)),
])
def test_byteps(n, k, expected):
    """The ring's time on the scaled link is BytePS' 2n(n-1)M/((n^2+kn-2k)B) with k servers."""
    time = lambda k: ring_allreduce_time(n, 1e8, 1e9 * s.byteps_link_scale(n, k), 0.0)
    assert time(k) == pytest.approx(expected)
    assert time(n) <= time(k) <= time(0)
