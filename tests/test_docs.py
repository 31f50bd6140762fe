"""The docs' command blocks, run in order as a new user pastes them after the README, on a fresh checkout.

The pages of tests/test_readme.py's ``PAGES`` (each method's trainers by hand, elastic Horovod, the
unhealthy cluster, clusters and SLURM, Kubernetes, the command reference, the long fuzz profile) run
page after page in one shell, under the same rules as the README's walk-through (sizes from the
environment, fixed ports mapped to free ones, each line that trains shortened to 20 steps). It is a
group of its own under pytest-xdist (tests/conftest.py), so it runs beside the README's walk-through
and the root tier rather than after them.
"""
import os

import pytest

from tests.test_readme import PAGES, assert_nothing_left, walk

pytestmark = pytest.mark.root


@pytest.mark.timeout(1800)
def test_every_docs_command_block_runs_in_order_on_a_fresh_checkout(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the docs' emulated-cluster and SLURM lines need root")
    checkout, _ = walk(PAGES, tmp_path, timeout=1500)
    # the pages' own outputs are there: the emulated comparison's report, the manifests, the projection
    for path in ("runs/emu/report.md", "runs/k8s-manifests/results-pvc.yaml", "runs/proj2/projection.md"):
        assert os.path.exists(os.path.join(checkout, path)), path
    assert_nothing_left(checkout)
