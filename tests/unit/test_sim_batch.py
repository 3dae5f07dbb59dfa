"""Batched gradients in the simulator (`sim.batch`) and the lazy epoch order (`dataset.shuffle`):
a batch of gradients equals the same gradients one at a time to float rounding; a batched
run is deterministic and simulates the same history of times as a one-at-a-time run; the
switch picks only models where batching pays; an affine epoch visits each sample once."""

from __future__ import annotations

import json

import pytest
import torch

from stalebench import experiment
from stalebench.data.sharding import AFFINE_FROM, Minibatches, shard_batches
from stalebench.engines.common import GradientStep, Net, batchable
from stalebench.errors import ConfigError
from stalebench.job import Job
from stalebench.metrics.events import read_events
from tests.conftest import compose, fast_with

# float32 rounding: a vmapped matmul sums in another order than one model's
RTOL, ATOL = 1e-5, 1e-6


def job_for(overrides: list[str], workers: int = 4) -> Job:
    over = ["budget.max_updates=10", "sim.batch=auto", *overrides, f"cluster.num_workers={workers}"]
    return Job.build(compose(fast_with(over)))


def steps_for(job: Job, net: Net, k: int, seed: int = 0) -> tuple[list[GradientStep], list]:
    """k workers' steps at k different θ (drawn from `seed`), each its own minibatches and
    BatchNorm buffers; and what each `then` received."""
    seen: list[tuple] = []
    steps = []
    gen = torch.Generator().manual_seed(seed)
    for w in range(k):
        theta = net.flat.detach().cpu() + 0.05 * torch.randn(net.flat.numel(), generator=gen)
        buffers = [b.detach().clone() for b in net.buffers]
        for b in buffers:
            if b.is_floating_point():
                b.add_(0.1 * w)  # each worker's own statistics
        out = torch.zeros(net.flat.numel())
        then = lambda grad, loss: seen.append((grad, loss))  # noqa: E731
        steps.append(GradientStep(net, theta, buffers, job.batches(w), out, then))
    return steps, seen


def alone_and_batched(job: Job, k: int) -> tuple[tuple[list, list], tuple[list, list], Net]:
    """k workers' steps (`steps_for`) run one at a time, and the same steps run as a batch:
    each (steps, what their `then` received); and the net they share."""
    net = Net(job, torch.device("cpu"))
    alone, batched = steps_for(job, net, k), steps_for(job, net, k)
    for step in alone[0]:
        step()
    net.run_batch(batched[0])
    return alone, batched, net


@pytest.mark.parametrize(
    "model", [["model=mlp"], ["model=cnn", "model.batch_norm=true", "dataset.num_features=16"]]
)
def test_a_batch_of_gradients_equals_the_same_gradients_one_at_a_time(model):
    """Net.run_batch against GradientStep called alone, step by step: gradients, losses and
    the BatchNorm statistics each worker's forward pass leaves, within float rounding; each
    step's `then` gets its own `out`, in the steps' order."""
    (alone, seen_alone), (batched, seen_batched), net = alone_and_batched(job_for(model), 4)
    assert [g.data_ptr() for g, _ in seen_batched] == [s.out.data_ptr() for s in batched]
    for (g1, l1), (g2, l2) in zip(seen_alone, seen_batched, strict=True):
        assert torch.allclose(g1, g2, rtol=RTOL, atol=ATOL)
        assert l1 == pytest.approx(l2, rel=RTOL)
        assert not torch.equal(g1, torch.zeros_like(g1))
    for a, b in zip(alone, batched, strict=True):
        for x, y in zip(a.buffers, b.buffers, strict=True):
            assert torch.allclose(x.float(), y.float(), rtol=RTOL, atol=ATOL)
    if "model=cnn" in model:  # the statistics moved: the forward pass ran in training mode
        assert not torch.equal(alone[0].buffers[0], net.buffers[0])


def test_a_batch_of_unequal_minibatches_runs_one_batch_per_size():
    """A barrier that re-assigns minibatch sizes (DBS) gives workers different sizes: each
    size is its own vmapped batch, the results as one at a time."""
    job = job_for(["model=mlp"])
    net = Net(job, torch.device("cpu"))
    alone, seen_alone = steps_for(job, net, 3, seed=1)
    batched, seen_batched = steps_for(job, net, 3, seed=1)
    for steps in (alone, batched):
        steps[1].batches.size = 5
    for step in alone:
        step()
    net.run_batch(batched)
    for (g1, l1), (g2, l2) in zip(seen_alone, seen_batched, strict=True):
        assert torch.allclose(g1, g2, rtol=RTOL, atol=ATOL) and l1 == pytest.approx(l2, rel=RTOL)


def test_batching_is_chosen_where_it_pays():
    """auto: a model of at most sim.batch_max_params parameters on the CPU, any on CUDA; on
    and off as said; never a model with dropout (its random draws would change order)."""
    job = job_for(["model=mlp", "sim.batch_max_params=2000"])
    small = torch.nn.Linear(3, 2)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert batchable(job, small, 1000, cpu)
    assert not batchable(job, small, 3000, cpu)
    assert batchable(job, small, 3000, cuda)
    on, off = job_for(["model=mlp", "sim.batch=on"]), job_for(["model=mlp", "sim.batch=off"])
    assert batchable(on, small, 10**7, cpu) and not batchable(off, small, 10, cpu)
    conv2d = torch.nn.Conv2d(1, 2, 3)
    assert not batchable(job, conv2d, 20, cpu) and batchable(job, conv2d, 20, cuda)
    assert batchable(job, torch.nn.Conv1d(1, 2, 3), 20, cpu)
    dropout = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Dropout(0.1))
    assert not batchable(on, dropout, 10, cpu)
    assert batchable(on, torch.nn.Sequential(small, torch.nn.Dropout(0.0)), 10, cpu)


@pytest.mark.parametrize(
    "key, value", [("sim.batch", "maybe"), ("sim.batch_max", "0"), ("sim.batch_max_params", "-1")]
)
def test_bad_sim_settings_are_refused_by_name(key, value):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose(fast_with(["budget.max_updates=10", f"{key}={value}"]))


SIM = ["runtime=sim", "cluster=heterogeneous", "cluster.num_workers=8"]
# an engine per preset, each computing its gradients in its own way: ps (lazy pushes),
# allreduce (a round's), local (inner steps; in sync rounds and asynchronously), gossip
ENGINES = {
    "ps": ["algorithm=asp", "budget.max_updates=120"],
    "allreduce": ["algorithm=bsp", "engine=allreduce", "budget.max_updates=30"],
    "local": ["algorithm=diloco", "cluster.num_workers=4", "budget.max_updates=3",
              "algorithm.outer.inner_steps=10"],
    "local_async": ["algorithm=async_diloco", "cluster.num_workers=4", "budget.max_updates=6",
                    "algorithm.outer.inner_steps=10"],
    "gossip": ["algorithm=sgp", "budget.max_updates=60"],
}  # fmt: skip


def sim_run(tmp_path, name: str, extra: list[str]) -> tuple[dict, list[dict], bytes]:
    cfg = compose(fast_with([*SIM, *extra]))
    cfg.run_dir = str(tmp_path / name)
    summary = experiment.run(cfg)
    path = tmp_path / name / "events.jsonl"
    return summary, read_events(path), path.read_bytes()


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_batched_run_is_deterministic_and_simulates_the_same_times(tmp_path, engine):
    """Same seed, batch on: byte-identical events. Against batch off: every update at the same
    time, from the same worker, clock, version and lag (the simulated history does not
    depend on the gradients' last bits); the losses equal to float rounding for the first
    updates (later, rounding differences compound as in any two float orders); summary.json
    reports the batches and each gradient's bytes, and nothing when off."""
    over = ENGINES[engine]
    on1, events_on, bytes1 = sim_run(tmp_path, "on1", [*over, "sim.batch=on"])
    _, _, bytes2 = sim_run(tmp_path, "on2", [*over, "sim.batch=on"])
    off, events_off, _ = sim_run(tmp_path, "off", [*over, "sim.batch=off"])
    assert bytes1 == bytes2
    assert on1["status"] == off["status"] == "completed"
    keys = ("t", "worker", "clock", "version", "lag", "compute_s", "wait_s")
    on_updates = [e for e in events_on if e["kind"] == "update"]
    off_updates = [e for e in events_off if e["kind"] == "update"]
    assert [[e[k] for k in keys] for e in on_updates] == [[e[k] for k in keys] for e in off_updates]
    for a, b in zip(on_updates[:20], off_updates[:20], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    batch = on1["sim_batch"]
    assert batch["batches"] >= 1 and 1 < batch["largest"] <= 8  # gradients did batch
    d = sum(p.numel() for p in Job.build(compose(fast_with([*SIM, *over]))).model().parameters())
    assert batch["bytes_per_gradient"] >= 2 * 4 * d  # θ and its gradient, at least
    assert "sim_batch" not in off
    saved = json.loads((tmp_path / "on1" / "summary.json").read_text())
    assert saved["sim_batch"] == batch


def test_batch_max_bounds_a_batch(tmp_path):
    over = [*ENGINES["ps"], "sim.batch=on", "sim.batch_max=3"]
    summary, _, _ = sim_run(tmp_path, "capped", over)
    assert summary["status"] == "completed" and summary["sim_batch"]["largest"] == 3


def splits_of(n: int):
    cfg = compose(fast_with([f"dataset.num_train={n}", "budget.max_updates=10"]))
    return Job.build(cfg).splits


def test_an_affine_epoch_visits_every_sample_of_the_shard_once():
    """shuffle=affine: each epoch a bijection of the shard's positions, new per epoch and per
    worker stream, the same for the same stream; a shard larger than AFFINE_FROM is
    shuffled affinely under auto, a smaller one by randperm."""
    splits = splits_of(1000)
    shard = torch.arange(0, 1000, 3)  # 334 samples: 10 minibatches of 32, 14 left per epoch

    def epochs(stream: int, k: int = 2) -> list[list[int]]:
        mb = Minibatches(splits, shard, 32, stream, "affine")
        return [torch.cat([mb.take() for _ in range(10)]).tolist() for _ in range(k)]

    first, second = epochs(7)
    for epoch in (first, second):
        assert len(set(epoch)) == 320 and set(epoch) <= set(shard.tolist())
    assert first != second and epochs(7) == [first, second] and epochs(8)[0] != first
    assert sorted(first) != first  # not the shard's own order
    big = torch.arange(AFFINE_FROM + 1)
    assert Minibatches(splits, big, 32, 1, "auto").affine
    assert not Minibatches(splits, big[:AFFINE_FROM], 32, 1, "auto").affine
    assert not Minibatches(splits, big, 32, 1, "randperm").affine


def test_shuffle_auto_keeps_the_randperm_stream_of_small_shards():
    """The order every existing run of a shard up to AFFINE_FROM samples had: a seeded
    randperm per epoch (shuffle=auto and randperm draw the same minibatches)."""
    splits = splits_of(400)
    auto = shard_batches(splits, 1, 2, 8, 3)
    randperm = shard_batches(splits, 1, 2, 8, 3, shuffle="randperm")
    assert not auto.affine
    for _ in range(60):  # 2 epochs of a 200-sample shard
        assert torch.equal(next(auto)[0], next(randperm)[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_batch_on_cuda_equals_the_cpu_batch():
    """device=auto with CUDA: the batch runs on the GPU, its gradients back on the CPU in
    each step's `out`, equal to the CPU's to float rounding."""
    job = job_for(["model=mlp"])
    gpu, cpu = Net(job, torch.device("cuda")), Net(job, torch.device("cpu"))
    assert gpu.batchable
    on_gpu, seen_gpu = steps_for(job, gpu, 6, seed=2)
    on_cpu, seen_cpu = steps_for(job, cpu, 6, seed=2)
    gpu.run_batch(on_gpu)
    cpu.run_batch(on_cpu)
    for (g1, l1), (g2, l2) in zip(seen_gpu, seen_cpu, strict=True):
        assert g1.device.type == "cpu"
        assert torch.allclose(g1, g2, rtol=1e-4, atol=1e-5) and l1 == pytest.approx(l2, rel=1e-4)


def test_a_bf16_batch_through_batchnorm_equals_the_same_gradients_one_at_a_time():
    """Under bf16 autocast a BatchNorm layer gets a bfloat16 input and float32 weights, which
    the eager kernel takes and vmap's batch_norm refuses: batched, its input is made float32
    for it (`precision.norms_in_float32`), and the gradients are one at a time's, within
    bfloat16's rounding: a relative difference under 5 % (bf16's gradients of this model
    differ from fp32's by 1.4 to 2.7 %, one at a time or batched)."""
    job = job_for(["model=cnn", "model.batch_norm=true", "dataset.num_features=16",
                   "precision=bf16"])  # fmt: skip
    (_, seen_alone), (_, seen_batched), _ = alone_and_batched(job, 3)
    for (g1, l1), (g2, l2) in zip(seen_alone, seen_batched, strict=True):
        assert g2.dtype == torch.float32 and not torch.equal(g1, torch.zeros_like(g1))
        assert (g1 - g2).norm() < 0.05 * g1.norm(), (g1 - g2).norm() / g1.norm()
        assert l1 == pytest.approx(l2, rel=1e-2)
    job_for(["precision=fp32"])  # later tests of this process: float32 again
