"""Hybrid parallelism (stalebench.engines.allreduce.hybrid): a model-parallel layer's
traffic against its hand-computed cost, and a simulated round that pays it instead of the
layer's gradient."""

from __future__ import annotations

import pytest
import torch

from stalebench.cluster import ClusterConfig
from stalebench.engines.allreduce.hybrid import Hybrid
from stalebench.errors import ConfigError
from stalebench.runtime.network import Network
from tests.conftest import run_job


def test_a_model_parallel_layer_exchanges_its_inputs_and_keeps_its_gradient():
    nn = torch.nn
    net = nn.Sequential(
        nn.Conv1d(1, 2, 3), nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4)
    )
    hybrid = Hybrid.of(net, ["Linear"], batch=8)
    # each linear layer's inputs (8 examples × 12, then × 16 floats), then the last one's
    # outputs (8 × 4) back to their ranks
    assert hybrid.exchanges == (4 * 8 * 12, 4 * 8 * 16, 4 * 8 * 4)
    assert hybrid.tensors == frozenset({2, 3, 4, 5})  # the convolution's stay data-parallel
    assert hybrid.elements == 12 * 16 + 16 + 16 * 4 + 4
    # 4 ranks, 1 ms and 1 Gbit/s each way: a ring all-gather of b bytes from each is
    # 3 steps of (1 ms + b at 1 Gbit/s), forward and again backward
    cfg = ClusterConfig(num_workers=4, push_latency_ms=1, pull_latency_ms=1,
                        push_bandwidth_gbps=1, pull_bandwidth_gbps=1)  # fmt: skip
    hand = sum(2 * 3 * (0.001 + b * 8 / 1e9) for b in hybrid.exchanges)
    assert hybrid.seconds(Network(cfg).allgather_s) == pytest.approx(hand)
    # only the first: no way back to the ranks (the next layer is split too, or not)
    assert Hybrid.of(net, ["2"], batch=8).exchanges == (4 * 8 * 12,)


def test_model_parallel_names_linear_layers_of_the_model():
    net = torch.nn.Sequential(torch.nn.Conv1d(1, 2, 3), torch.nn.Flatten(), torch.nn.Linear(12, 4))
    with pytest.raises(ConfigError, match="'fc' names no module"):
        Hybrid.of(net, ["fc"], batch=8)
    with pytest.raises(ConfigError, match="'0' is a Conv1d, no linear layer"):
        Hybrid.of(net, ["0"], batch=8)


ROUND = [
    "runtime=sim",
    "algorithm=bsp",
    "engine=allreduce",
    "model=mlp",
    "model.hidden=[1024]",
    "dataset=synthetic",
    "dataset.num_features=40",
    "dataset.batch_size=2",
    "cluster=homogeneous",
    "cluster.num_workers=4",
    "cluster.compute_ms=10",
    "cluster.push_latency_ms=1",
    "cluster.pull_latency_ms=1",
    "cluster.push_bandwidth_gbps=0.01",
    "cluster.pull_bandwidth_gbps=0.01",
    "eval.every_updates=0",
    "budget.max_updates=10",
]


@pytest.mark.timeout(60)
def test_sim_a_round_pays_the_exchanges_instead_of_the_layers_gradients(tmp_path):
    # every layer of the MLP model-parallel: a round is the step, the exchanges, and an
    # all-reduce of the round's header alone (3 · 4 + 1 slots)
    run = run_job(tmp_path / "mp", [*ROUND, "engine.model_parallel=[Linear]"])
    assert run.summary["status"] == "completed", run.summary["error"]
    net = Network(ClusterConfig(num_workers=4, push_latency_ms=1, pull_latency_ms=1,
                                push_bandwidth_gbps=0.01, pull_bandwidth_gbps=0.01))  # fmt: skip
    mlp = torch.nn.Sequential(torch.nn.Linear(40, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 2))
    hybrid = Hybrid.of(mlp, ["Linear"], batch=2)
    hand = (
        0.010 + hybrid.seconds(net.allgather_s) + net.allreduce_s(4 * 16)
    )  # 13 slots, padded to 16
    per_round = run.summary["run_time_s"] / run.summary["updates"]
    assert per_round == pytest.approx(hand, rel=0.01)
    # data-parallel: the gradient's ring instead (43,010 floats against a few KB of
    # activations at 2 examples a rank), far longer at 10 Mbit/s
    dp = run_job(tmp_path / "dp", ROUND)
    assert dp.summary["run_time_s"] / dp.summary["updates"] > 1.5 * per_round


def test_model_parallel_is_refused_in_real_processes(tmp_path):
    real = [o for o in ROUND if o != "runtime=sim"]
    with pytest.raises(Exception, match="engine.model_parallel.*simulator"):
        run_job(tmp_path, [*real, "engine.model_parallel=[Linear]"])
