"""engine=allreduce with its rounds in pieces, when a worker dies: the run ends `failed`
with the reason in summary.json, whatever pieces were still under way (buckets and P3)."""

import pytest

from tests.conftest import FAST, run_job


@pytest.mark.timeout(120)
@pytest.mark.parametrize("schedule", ["fifo", "p3"])
def test_a_worker_lost_mid_run_fails_the_run_with_its_reason(tmp_path, schedule):
    run = run_job(
        tmp_path,
        [
            *FAST,
            "algorithm=bsp",
            "engine=allreduce",
            "cluster.num_workers=2",
            "engine.bucket_mb=0.0005",
            f"engine.schedule={schedule}",
            "budget.max_updates=50",
            "cluster.faults=[{worker:1,at_step:5,action:die}]",
        ],
    )
    s = run.summary
    assert s["status"] == "failed"
    assert "worker 1 (rank 1)" in s["error"] and "cluster.faults" in s["error"]
    assert s["updates"] <= 5
