"""Real processes over gloo on CPU: semantics read back from events.jsonl, invariants of
docs/algorithms.md §12 on final parameters, and failure handling. Every test has a timeout."""

from __future__ import annotations

import re

import pytest
import torch

from stalebench.metrics.events import schema_errors
from tests.conftest import SUMMARY_FIELDS

pytestmark = pytest.mark.slow


def updates_of(events):
    return [e for e in events if e["kind"] == "update"]


def clock_spreads(events, n):
    """For each update (in log order): (its worker's step c, completed steps of every worker
    before it was logged)."""
    done = [0] * n
    for e in updates_of(events):
        yield e, list(done)
        done[e["worker"]] += 1


@pytest.mark.timeout(120)
def test_ssp_run_writes_the_run_directory(job):
    summary, events, run_dir = job("algorithm=ssp", "budget.max_updates=60")
    assert summary["status"] == "completed", summary["error"]
    assert SUMMARY_FIELDS <= set(summary)
    assert summary["updates"] == 60 and summary["num_workers"] == 4
    assert summary["algorithm"] == "ssp" and summary["cluster"] == "homogeneous"
    assert summary["bytes_sent"] > 0 and 0 < summary["compute_fraction"] <= 1
    assert all(not schema_errors(e) for e in events)
    assert {"events.jsonl", "metrics.parquet", "summary.json", "model.pt"} <= {
        p.name for p in run_dir.iterdir()
    }
    import pandas as pd

    assert len(pd.read_parquet(run_dir / "metrics.parquet")) == len(events)
    # each rank froze what its start built, so no full collection walks it mid-run
    for rank in range(5):
        log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        frozen = re.search(rf"rank {rank}: (\d+) objects of its start kept out", log)
        assert frozen and int(frozen.group(1)) > 10_000, log


@pytest.mark.timeout(120)
def test_bsp_every_lag_is_zero_and_clocks_differ_by_at_most_one(job):
    summary, events, _ = job(
        "algorithm=bsp",
        "cluster.num_workers=3",
        "budget.max_updates=30",
        "cluster.slowdown=[1,2,3]",
    )
    assert summary["status"] == "completed", summary["error"]
    ups = updates_of(events)
    assert len(ups) == 90 and summary["updates"] == 30  # a round = one update of 3 gradients
    assert {e["lag"] for e in ups} == {0}
    for _, done in clock_spreads(events, 3):
        assert max(done) - min(done) <= 1
    assert summary["max_clock_gap"] == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("s", [0, 1, 3])
def test_ssp_clock_gap_never_exceeds_staleness(job, s):
    # worker 2 is 4x slower, so the fast ones press against the bound all the time
    summary, events, _ = job(
        "algorithm=ssp",
        f"algorithm.barrier.staleness={s}",
        "cluster.num_workers=3",
        "cluster.slowdown=[1,1,4]",
        "budget.max_updates=60",
    )
    assert summary["status"] == "completed", summary["error"]
    for e, done in clock_spreads(events, 3):
        # step c was admitted before this push: every worker had completed >= c − s then
        assert e["clock"] - min(done) <= s, (e, done)
    assert summary["max_clock_gap"] == s  # the bound is reached, never passed


@pytest.mark.timeout(120)
def test_asp_mean_lag_is_close_to_n_minus_one(job):
    summary, _, _ = job(
        "algorithm=asp", "cluster.num_workers=4", "cluster.compute_ms=10", "budget.max_updates=200"
    )
    assert summary["status"] == "completed", summary["error"]
    assert abs(summary["lag"]["mean"] - 3) < 0.35, summary["lag"]
    assert summary["max_clock_gap"] > 0


def final_params(job_dir):
    return torch.load(job_dir / "model.pt")


@pytest.mark.timeout(150)
def test_ssp_zero_per_round_equals_bsp(job):
    common = [
        "cluster.num_workers=3",
        "cluster.slowdown=[1,1,3]",
        "budget.max_updates=15",
        "algorithm/update=momentum",
        "seed=3",
    ]
    bsp, _, bsp_dir = job("algorithm=bsp", *common)
    bsp_params = final_params(bsp_dir)
    ssp, _, ssp_dir = job(
        "algorithm=ssp",
        "algorithm.barrier.staleness=0",
        "algorithm.barrier.apply=per_round",
        *common,
    )
    ssp_params = final_params(ssp_dir)
    assert bsp["status"] == ssp["status"] == "completed"
    assert bsp["updates"] == ssp["updates"] == 15
    for key in bsp_params:
        assert torch.equal(bsp_params[key], ssp_params[key]), key
    # and it is a real trajectory, not a fixed point
    from stalebench.job import Job
    from tests.conftest import compose

    init = (
        Job.build(compose(["dataset=synthetic", "model=mlp", "model.hidden=[32]", "seed=3"]))
        .model()
        .state_dict()
    )
    assert not torch.equal(init["1.weight"], bsp_params["1.weight"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "compiled",
    [[], ["compile=true", "compile_backend=eager"], ["precision=fp16"]],
    ids=["eager", "compiled", "fp16"],
)
def test_one_worker_asp_equals_sequential_sgd(job, compiled):
    """Also with the worker's model compiled (torch.compile with its `eager` backend: the
    graphs dynamo captures, run as they are), the same θ to float rounding; and in fp16,
    the θ of torch's own mixed-precision loop (autocast to float16, a GradScaler)."""
    from stalebench.data import shard_batches
    from stalebench.job import Job
    from tests.conftest import FAST, compose

    overrides = [
        "algorithm=asp",
        "cluster.num_workers=1",
        "budget.max_updates=25",
        "seed=7",
        "algorithm.update.lr=0.2",
    ]
    summary, _, run_dir = job(*overrides, *compiled)
    assert summary["status"] == "completed" and summary["lag"]["max"] == 0
    assert summary["arithmetic"]["compile"] == ("eager" if "compile=true" in compiled else False)
    cfg = compose(FAST + overrides)
    reference = Job.build(cfg)
    model = reference.model()
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    batches = shard_batches(reference.splits, 0, 1, cfg.dataset.batch_size, cfg.seed)
    fp16 = compiled == ["precision=fp16"]
    assert summary["arithmetic"]["precision"] == ("fp16" if fp16 else "fp32")
    scaler = torch.amp.GradScaler("cpu", enabled=fp16)
    for _ in range(25):
        x, y = next(batches)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16, enabled=fp16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    got = final_params(run_dir)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(got[key], value, rtol=0, atol=1e-6)


@pytest.mark.timeout(120)
def test_divergence_is_reported_with_a_summary(job):
    summary, events, _ = job("algorithm=asp", "algorithm.update.lr=1e12", "budget.max_updates=200")
    assert summary["status"] == "diverged"
    assert summary["updates"] < 200
    assert any(e["kind"] == "system" and e["event"] == "end" for e in events)


@pytest.mark.timeout(120)
def test_a_silent_worker_fails_the_run_within_the_timeout(job):
    # BSP: worker 1 takes 6 s per step while the run tolerates 2 s of silence; worker 0,
    # held by the barrier meanwhile, is told to stop when the run fails
    summary, events, run_dir = job(
        "algorithm=bsp",
        "cluster.num_workers=2",
        "cluster.compute_ms=300",
        "cluster.slowdown=[1,20]",
        "timeout_s=2",
        "budget.max_updates=100",
    )
    assert summary["status"] == "failed"
    assert "worker 1 (rank 2) silent" in summary["error"], summary["error"]
    stops = [e["worker"] for e in events if e["kind"] == "worker" and e["event"] == "stop"]
    assert stops == [0]
    assert "worker 0 (rank 1) done" in (run_dir / "logs" / "rank-1.log").read_text()


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "common",
    [
        ["algorithm=bsp", "cluster.num_workers=2", "budget.max_updates=10"],
        ["runtime=sim", "algorithm=asp", "cluster.num_workers=4", "budget.max_updates=20"],
        ["engine=allreduce", "algorithm=bsp", "cluster.num_workers=2", "budget.max_updates=10"],
        ["engine=allreduce", "algorithm=bsp", "engine.bucket_mb=0.0005", "engine.schedule=p3",
         "cluster.num_workers=2", "budget.max_updates=10"],
        ["engine=local", "algorithm=local_sgd", "cluster.num_workers=2",
         "budget.max_updates=4"],
        ["engine=gossip", "algorithm=sgp", "cluster.num_workers=2", "budget.max_updates=10"],
    ],
    ids=["real-workers", "simulator", "allreduce", "allreduce-p3", "local", "gossip"],
)  # fmt: skip
def test_gradients_on_cuda_match_cpu(job, common):
    """Every engine's state on the GPU (θ, the rules', replicas' and nodes' state; the
    parameter server's by server_device=auto), its messages through host memory: the θ
    the CPU ends with, to float rounding."""
    cpu, _, cpu_dir = job("device=cpu", *common)
    gpu, _, gpu_dir = job("device=cuda", *common)
    assert cpu["status"] == gpu["status"] == "completed"
    a, b = final_params(cpu_dir), final_params(gpu_dir)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)
