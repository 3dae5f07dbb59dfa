"""Rules against the authors' own code (docs/algorithms.md §3.1, §9.2, §10.4, §11.8): the
DANA/SMEGA2 simulators' warm-up (np.linspace, η at update W − 1), DANA's look-ahead at the
rate just applied (the DANA-DC script's loop, transcribed), AsyncPP's PipeMare correction
(p = 1 − (1 + step)/T) and the SGP paper's graph (graph_type 0 of the SGP repository,
transcribed from gossip/graph_manager.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from stalebench.algorithms.dana import Dana, DanaConfig
from stalebench.algorithms.gossip import GOSSIP, MixingConfig
from stalebench.algorithms.pipeline import AdamConfig, PipelineConfig, stage_hyper
from stalebench.algorithms.updates import SGD, SGDConfig
from tests.conftest import run_job

# ---------------------------------------------------------------- warm-up (§3.1)


@pytest.mark.parametrize("warm", [1, 2, 5, 625])
@pytest.mark.parametrize("n", [1, 4, 16])
def test_the_warm_up_is_the_simulators_linspace_to_the_last_bit(warm, n):
    """trainer.py: warmup_lr = np.linspace(η/N, η, W); one popped before each update, the
    last kept after."""
    rule = SGD(SGDConfig(name="sgd", lr=0.1, warmup_updates=warm), torch.zeros(1), n)
    reference = np.linspace(0.1 / n, 0.1, warm).tolist()
    rates = []
    for _ in range(warm + 3):
        rates.append(rule.lr)
        rule.step(torch.zeros(1), torch.zeros(1), 0, 0)
    assert rates[:warm] == reference  # ==: numpy's own arithmetic
    assert rates[warm:] == [0.1] * 3


def test_the_warm_up_reaches_lr_at_update_w_minus_1():
    """η = 0.4, N = 4, W = 5: η/N + t·0.075, so 0.325 at W − 2 and η at W − 1 (not at W)."""
    rule = SGD(SGDConfig(name="sgd", lr=0.4, warmup_updates=5), torch.zeros(1), 4)
    assert [rule.rate(k) for k in (0, 3, 4, 5)] == pytest.approx([0.1, 0.325, 0.4, 0.4])
    assert rule.rate(4) == 0.4  # linspace sets its end point exactly


# ---------------------------------------------------------------- DANA (§9.2)


def reference_dana(grad_at, order, theta0, n, lr, gamma, wd, warm, dc):
    """The DANA-DC script's simulation loop (train() with utils.py's load_worker, load_master,
    delay_compensation, update_master, update_worker), transcribed onto flat tensors: the
    rate is popped before each update and the look-ahead is taken after the step at the
    rate that step used."""
    rates = np.linspace(lr / n, lr, warm).tolist()
    master, rate = theta0.clone(), lr
    workers = [theta0.clone() for _ in range(n)]
    bufs = [torch.zeros_like(theta0) for _ in range(n)]
    total = torch.zeros_like(theta0)  # args.momentum_sum
    for w in order:
        if rates:
            rate = rates.pop(0)
        g = grad_at(workers[w])
        g = g + dc * g * g * (master - workers[w])  # delay_compensation
        buf = bufs[w] * gamma + (g + wd * master)  # torch SGD, worker w's buffer loaded
        master = master - rate * buf
        total = total + (buf - bufs[w])
        bufs[w] = buf
        workers[w] = master - total * (rate * gamma)  # f = lr × momentum, read after the step
    return master, workers


@pytest.mark.parametrize("variant, dc", [("zero", 0.0), ("dc", 2.0)])
def test_dana_replays_the_authors_simulation_through_the_warm_up(variant, dc):
    """Gradients of a quadratic at each worker's look-ahead, workers in a fixed order: θ and
    every look-ahead sent follow the authors' loop (float64, to rounding)."""
    n, dim = 4, 6
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(dim, dim, generator=gen, dtype=torch.float64) / dim**0.5
    b = torch.randn(dim, generator=gen, dtype=torch.float64)
    grad_at = lambda x: a.T @ (a @ x - b)  # noqa: E731
    theta0 = torch.randn(dim, generator=gen, dtype=torch.float64)
    order = [0, 2, 1, 3, 0, 0, 3, 1, 2, 1, 0, 3, 2, 2, 1, 0, 3, 1]
    kw = dict(lr=0.2, momentum=0.9, weight_decay=1e-2, warmup_updates=7)
    ref_theta, ref_sent = reference_dana(grad_at, order, theta0, n, 0.2, 0.9, 1e-2, 7, dc)

    theta = theta0.clone()
    rule = Dana(DanaConfig(name="dana", variant=variant, dc_lambda=dc, **kw), theta, n)
    held = [rule.params_for(theta, w).clone() for w in range(n)]
    for w in order:
        rule.step(theta, grad_at(held[w]), w, lag=1)
        held[w] = rule.params_for(theta, w).clone()
    close = dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(theta, ref_theta, **close)
    for mine, theirs in zip(held, ref_sent, strict=True):
        torch.testing.assert_close(mine, theirs, **close)


def test_dana_look_ahead_after_update_t_uses_eta_t():
    """θ = 1, η = 0.4, N = 4, W = 3 (η_t = 0.1, 0.25, 0.4), γ = 0.5, g = 1 twice from
    worker 0: v = 1, θ = 0.9; then v = 1.5, θ = 0.9 − 0.25·1.5 = 0.525; look-aheads
    θ − η_t·γ·S at the η_t each update used."""
    theta = torch.tensor([1.0], dtype=torch.float64)
    rule = Dana(DanaConfig(name="dana", lr=0.4, momentum=0.5, warmup_updates=3), theta, 4)
    rule.step(theta, torch.ones(1, dtype=torch.float64), 0, lag=0)
    assert float(rule.params_for(theta, 0)) == pytest.approx(0.9 - 0.1 * 0.5 * 1.0)
    rule.step(theta, torch.ones(1, dtype=torch.float64), 0, lag=0)
    assert float(rule.params_for(theta, 0)) == pytest.approx(0.525 - 0.25 * 0.5 * 1.5)
    assert rule.applied_lr == pytest.approx(0.25) and rule.lr == 0.4


# ---------------------------------------------------------------- PipeMare (§10.4)


def asyncpp_rate(lr, tau, step, steps):
    """main_with_runtime.py, adjust_learning_rate: lr / (num_versions − 1) **
    (1 − min((1 + step) / T, 1)), num_versions − 1 = τ."""
    return lr / tau ** (1 - min(float(1 + step) / steps, 1))


def test_the_pipemare_correction_counts_the_step_from_one():
    pipe = PipelineConfig(stages=4, lr_correction_steps=10)
    opt = AdamConfig(name="adamw", lr=0.1)
    for stage in range(3):  # τ = 3, 2, 1
        tau = pipe.delay(stage)
        for step in range(25):
            assert stage_hyper(pipe, opt, stage, step)[0] == asyncpp_rate(0.1, tau, step, 10)
    assert stage_hyper(pipe, opt, 0, 0)[0] == pytest.approx(0.1 / 3**0.9)  # p = 1 − 1/T
    assert stage_hyper(pipe, opt, 0, 9)[0] == 0.1  # p = 0 at step T − 1


# ---------------------------------------------------------------- SGP's graph (§11.8)


def reference_peers(rank, n, k):
    """graph_manager.py's DynamicDirectedExponentialGraph, one peer an iteration: the phone
    book of rank (+2^i, then −2^i by `_rotate_backward`, i up to int(log(N − 1, 2)); a
    repeat is not removed), the group index rotated once after every gossip."""
    book = []
    for i in range(0, int(math.log(n - 1, 2)) + 1):
        back = rank
        for _ in range(2**i):
            back = back - 1 if back > 0 else n - 1
        book += [(rank + 2**i) % n, back]
    return book[k % len(book)]


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9, 16, 17, 32])
def test_the_papers_graph_is_the_sgp_repositorys_graph_type_0(n):
    rule = GOSSIP.build(MixingConfig(name="pushsum", topology="exponential_alternating"), n)
    for k in range(3 * 2 * 6):
        for i in range(n):
            assert rule.out_peers(i, k) == [reference_peers(i, n, k)]
            assert rule.in_peers(i, k) == [j for j in range(n) if reference_peers(j, n, k) == i]


def test_the_papers_graph_cycles_plus_and_minus_powers_of_two():
    rule = lambda n: GOSSIP.build(  # noqa: E731
        MixingConfig(name="pushsum", topology="exponential_alternating"), n
    )
    # N = 8: hops +1, −1, +2, −2, +4, −4 (the same peer), then again
    assert [rule(8).out_peers(0, k)[0] for k in range(8)] == [1, 7, 2, 6, 4, 4, 1, 7]
    # N = 5: ⌊log2 4⌋ = 2, so ±4 too (4 ≡ −1)
    assert [rule(5).out_peers(0, k)[0] for k in range(7)] == [1, 4, 2, 3, 4, 1, 1]
    assert [rule(16).out_peers(3, k)[0] for k in range(9)] == [4, 2, 5, 1, 7, 15, 11, 11, 4]
    assert [rule(16).in_peers(3, k)[0] for k in range(4)] == [2, 4, 1, 5]
    assert [rule(2).out_peers(1, k)[0] for k in range(3)] == [0, 0, 0]


@pytest.mark.timeout(60)
def test_on_the_papers_graph_a_paused_node_delays_its_out_peer_of_that_iteration(tmp_path):
    """N = 4, hops +1, −1, +2, −2: the pause strikes node 1's iteration 2, hop +2, so node 3
    waits for its message and node 2 (in-peer 0 there) does not."""
    run = run_job(
        tmp_path / "paused",
        [
            "runtime=sim",
            "algorithm=sgp",
            "algorithm.gossip.topology=exponential_alternating",
            "cluster.num_workers=4",
            "budget.max_updates=12",
            "cluster.compute_ms=10",
            "engine.sync_every=12",
            "cluster.faults=[{worker:1,at_s:0.02,duration_s:1.0}]",
        ],
    )
    assert run.summary["status"] == "completed"
    third = {e["worker"]: e for e in run.events if e["kind"] == "update" and e["clock"] == 2}
    assert third[3]["wait_s"] == pytest.approx(1.0)
    assert third[2]["wait_s"] == 0.0 and third[2]["t"] == pytest.approx(0.03)
