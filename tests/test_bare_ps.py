"""benchmarks/bare_ps.py's statistics: pairs, pooling of invocations, the bootstrap interval."""
import importlib.util
import json
import os

import pytest

from tests.conftest import REPO, py

pytestmark = pytest.mark.process

spec = importlib.util.spec_from_file_location("bare_ps", os.path.join(REPO, "benchmarks", "bare_ps.py"))
bare_ps = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bare_ps)


def runs(pairs, mode="async"):
    """Result rows as the script writes them: (bare, hvdps) samples/s per repeat."""
    out = []
    for rep, (bare, ours) in enumerate(pairs):
        out += [{"impl": "bare", "mode": mode, "samples_per_sec": bare, "wall_s": 10.0, "repeat": rep},
                {"impl": "hvdps", "mode": mode, "samples_per_sec": ours, "wall_s": 9.0, "repeat": rep}]
    return out


def test_pooled_pairs_stay_within_their_invocation(tmp_path):
    # Both files have a repeat 0; each hvdps run must be set against its own invocation's bare run.
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"results": runs([(100.0, 90.0), (100.0, 110.0)])}))
    b.write_text(json.dumps({"results": runs([(50.0, 50.0), (40.0, 44.0)])}))
    results, modes, impls = bare_ps.pooled([str(a), str(b)])
    assert modes == ["async"] and impls == ["hvdps"]
    assert sorted(bare_ps.pair_ratios(results, "hvdps", "async")) == pytest.approx([0.9, 1.0, 1.1, 1.1])
    rows = bare_ps.table(results, modes, impls)
    assert "| async | hvdps |" in rows[3] and "1.05x" in rows[3]     # median of 0.9, 1.0, 1.1, 1.1


@pytest.mark.parametrize("values, inside", [([1.0] * 10, 1.0), ([0.9, 1.0, 1.1] * 10, 1.0), ([2.0, 2.1, 1.9], 2.0)])
def test_bootstrap_interval_holds_the_median(values, inside):
    low, high = bare_ps.bootstrap_median(values)
    assert low <= inside <= high and high - low <= max(values) - min(values)


def test_bootstrap_needs_three_pairs():
    assert bare_ps.bootstrap_median([1.0, 1.1]) is None


def test_pool_of_a_bad_file_is_a_usage_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = py(os.path.join(REPO, "benchmarks", "bare_ps.py"), "--pool", str(bad), timeout=60)
    assert r.returncode == 2 and "not a bare_ps.py result file" in r.stderr and "Traceback" not in r.stderr


def test_step_cost_table_gives_each_way_against_ps_train():
    """benchmarks/ps_step_cost.py's table: each way's median CPU per step and the median of its block
    ratios to ps_train's plain session, with the quartiles of those ratios."""
    spec = importlib.util.spec_from_file_location("ps_step_cost", os.path.join(REPO, "benchmarks", "ps_step_cost.py"))
    cost = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cost)
    ours = [5.0, 6.0, 5.0, 4.0]
    blocks = {way: [{"cpu_ms": c * k, "wall_ms": 1.0} for c in ours]
              for way, k in zip(cost.WAYS, (1.1, 1.0, 1.05, 1.25))}
    blocks[cost.WAYS[3]][0]["cpu_ms"] = 5.0 * 1.5          # one noisy block: the median ratio stays
    rows = dict((r.split(" | ")[0].lstrip("| "), r) for r in cost.table(blocks)[2:])
    assert "| 5.00 | 1.000 [1.000, 1.000] |" in rows["ps_train"]
    assert "| 5.50 | 1.100 [1.100, 1.100] |" in rows["classic"]
    assert "| 1.250 [1.250, 1.250] |" in rows["ps_train, + StopAtStepHook"]
