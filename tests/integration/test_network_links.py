"""A hub's NIC is one link each way for all its peers, in the simulator and in real
processes alike (stalebench.runtime.network)."""

from __future__ import annotations

import pytest

from tests.conftest import run_job

# ASP over 4 workers, a 287k-parameter MLP (1.15 MB a message), 100 Mbit/s each way: one
# push holds the server's downlink 92 ms, so the server takes at most ~10.9 pushes a second;
# with a link of its own per worker (no sharing) each worker would cycle in push + pull +
# step = 0.19 s, ~21 updates a second
SERVER_LINK = [
    "algorithm=asp",
    "model=mlp",
    "model.hidden=[512,512]",
    "dataset=mnist1d",
    "cluster=homogeneous",
    "cluster.num_workers=4",
    "cluster.compute_ms=10",
    "cluster.push_bandwidth_gbps=0.1",
    "cluster.pull_bandwidth_gbps=0.1",
    "budget.max_updates=0",
    "budget.max_wall_s=3",
    "eval.every_s=1.5",
    "eval.every_updates=0",
]


def limit_per_s(run) -> float:
    """The server link's limit: its bandwidth over one push's bytes (the parameters alone:
    the header makes the true limit a little lower)."""
    params = 40 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10
    return 0.1e9 / 8 / (4 * params)


@pytest.mark.timeout(60)
def test_sim_a_server_takes_no_more_pushes_than_its_link_carries(tmp_path):
    run = run_job(tmp_path / "sim", ["runtime=sim", *SERVER_LINK])
    assert run.summary["status"] == "completed", run.summary["error"]
    rate = run.summary["updates"] / run.summary["wall_time_s"]
    # at the link's limit: its queue, not the workers, sets the pace
    assert 0.85 * limit_per_s(run) <= rate <= limit_per_s(run)


@pytest.mark.timeout(90)
def test_real_a_server_takes_no_more_pushes_than_its_link_carries(tmp_path):
    run = run_job(tmp_path / "real", SERVER_LINK)
    assert run.summary["status"] == "completed", run.summary["error"]
    rate = run.summary["updates"] / run.summary["wall_time_s"]
    assert rate <= 1.05 * limit_per_s(run)  # a margin for where the window ends
