"""Staleness-mitigating and momentum-family update rules against docs/algorithms.md: formulas on
hand-computed tensors (§7, §8, §9, §11.1) and the reductions of §12, each by driving two rules
with the same gradients."""

import math

import pytest
import torch

from stalebench.algorithms.barriers import ASP, ASPConfig
from stalebench.algorithms.base import UPDATES, UpdateConfig
from stalebench.algorithms.dana import (
    Dana,
    DanaConfig,
    DanaGapAware,
    DanaGapAwareConfig,
    MultiMomentum,
    MultiMomentumConfig,
)
from stalebench.algorithms.staleness import (
    DCASGD,
    DCASGDConfig,
    GapAware,
    GapAwareConfig,
    StalenessAware,
    StalenessAwareConfig,
)
from stalebench.algorithms.updates import SGD, Momentum, MomentumConfig, SGDConfig
from stalebench.engines.ps import ParameterServer, Push
from stalebench.errors import ConfigError


def exact(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def t(*values):
    return torch.tensor(values, dtype=torch.float64)


def gradients(steps, dim=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(dim, generator=gen, dtype=torch.float64) for _ in range(steps)]


THETA0 = t(0.3, -1.2, 0.7, 2.0, -0.4)

# ---------------------------------------------------------------- SA (§7)


def test_sa_divides_the_whole_step_by_the_lag():
    """θ ← θ − (η/τ)(g + wd·θ) for τ = 4 (weight decay divided too); τ = 0, 1 leave it."""
    theta = t(1.0, 2.0)
    rule = StalenessAware(StalenessAwareConfig(name="sa", lr=0.5, weight_decay=0.5), theta, 3)
    rule.step(theta, t(2.0, -4.0), worker=0, lag=4)  # g + wd·θ = (2.5, −3); η/τ = 0.125
    exact(theta, t(0.6875, 2.375))
    rule.step(theta, t(2.0, -4.0), worker=1, lag=0)  # g + wd·θ = (2.34375, −2.8125); η = 0.5
    exact(theta, t(-0.484375, 3.78125))


def base_rule(momentum, nesterov, kw, theta):
    """The rule a penalised one reduces to: shared momentum, or plain SGD without it."""
    if momentum:
        return Momentum(
            MomentumConfig(name="m", momentum=momentum, nesterov=nesterov, **kw), theta, 3
        )
    return SGD(SGDConfig(name="sgd", **kw), theta, 3)


@pytest.mark.parametrize(
    "momentum, nesterov, wd",
    [(0.0, False, 0.0), (0.0, False, 1e-2), (0.9, False, 1e-2), (0.8, True, 0.0)],
)
def test_sa_with_lags_at_most_one_equals_sgd_or_momentum(momentum, nesterov, wd):
    kw = dict(lr=0.1, weight_decay=wd)
    sa_theta, ref_theta = THETA0.clone(), THETA0.clone()
    sa = StalenessAware(
        StalenessAwareConfig(name="sa", momentum=momentum, nesterov=nesterov, **kw), sa_theta, 3
    )
    ref = base_rule(momentum, nesterov, kw, ref_theta)
    for step, g in enumerate(gradients(12)):
        sa.step(sa_theta, g, worker=step % 3, lag=step % 2)
        ref.step(ref_theta, g, worker=step % 3, lag=step % 2)
        exact(sa_theta, ref_theta)


# ---------------------------------------------------------------- Gap-Aware (§8)


def test_gap_aware_penalty_without_momentum_by_hand():
    """η = 0.5, β = 9/16, eps = 0.4; u = the raw gradient. θ₀ = (1, 2) sent to both workers."""
    cfg = GapAwareConfig(name="ga", lr=0.5, beta=0.5625, eps=0.4)
    theta = t(1.0, 2.0)
    rule = GapAware(cfg, theta, 2)
    rule.params_for(theta, 0)
    rule.params_for(theta, 1)
    # worker 0, g = (2, −4): EMA = (7/16)·(4, 16) = (1.75, 7); k = 1; √(EMA/(7/16)) = (2, 4);
    # C = 0.5·((2, 4) + 0.4) = (1.2, 2.2); Δ = 0 → G = 1; θ = (1, 2) − 0.5·(2, −4) = (0, 4)
    rule.step(theta, t(2.0, -4.0), worker=0, lag=0)
    exact(rule.penalty, t(1.0, 1.0))
    exact(theta, t(0.0, 4.0))
    rule.params_for(theta, 0)
    # worker 1 read θ₀, g = (−2, 0): EMA = (9/16)(1.75, 7) + (7/16)(4, 0) = (175/64, 63/16);
    # 1 − β² = 175/256 → √(EMA/(175/256)) = (√4, √5.76) = (2, 2.4); C = 0.5·(2.4, 2.8)
    # = (1.2, 1.4); Δ = (0, 4) − (1, 2) = (−1, 2); G = (1 + 1/1.2, 1 + 2/1.4) = (11/6, 17/7)
    rule.step(theta, t(-2.0, 0.0), worker=1, lag=1)
    torch.testing.assert_close(rule.penalty, t(11 / 6, 17 / 7))
    torch.testing.assert_close(theta, t(6 / 11, 4.0))  # (0, 4) − 0.5·(−2·6/11, 0)


def test_gap_aware_penalty_with_momentum_by_hand():
    """Heavy ball γ = 0.5; u = the buffer *before* this step (FTPipe order, A-GA-2)."""
    cfg = GapAwareConfig(name="ga", lr=0.5, momentum=0.5, beta=0.5625, eps=0.4)
    theta = t(1.0, 2.0)
    rule = GapAware(cfg, theta, 2)
    # worker 0, g = (2, −4): u = v = 0 → EMA = 0, C = 0.5·0.4 = 0.2; Δ = 0 → G = 1;
    # v = (2, −4); θ = (0, 4)
    rule.step(theta, t(2.0, -4.0), worker=0, lag=0)
    exact(rule.penalty, t(1.0, 1.0))
    exact(theta, t(0.0, 4.0))
    # worker 1 never sent anything: θ̂_1 = θ₀ = (1, 2). g = (−2, 0); u = v = (2, −4):
    # EMA = (7/16)(4, 16) = (1.75, 7); /(175/256) = (2.56, 10.24); √ = (1.6, 3.2);
    # C = 0.5·(2.0, 3.6) = (1, 1.8); Δ = (−1, 2); G = (2, 1 + 2/1.8) = (2, 19/9);
    # g/G = (−1, 0); v = 0.5·(2, −4) + (−1, 0) = (0, −2); θ = (0, 4) − 0.5·(0, −2) = (0, 5)
    rule.step(theta, t(-2.0, 0.0), worker=1, lag=1)
    torch.testing.assert_close(rule.penalty, t(2.0, 19 / 9))
    torch.testing.assert_close(theta, t(0.0, 5.0))


def test_gap_aware_penalises_the_weight_decay_term():
    """(g + wd·θ)/G: one stale step with wd = 0.5, β = 9/16, eps = 0.4, η = 0.5."""
    cfg = GapAwareConfig(name="ga", lr=0.5, weight_decay=0.5, beta=0.5625, eps=0.4)
    theta = t(1.0, 2.0)
    rule = GapAware(cfg, theta, 2)
    rule.step(theta, t(2.0, -4.0), worker=0, lag=0)  # G = 1: θ = (1, 2) − 0.5·(2.5, −3)
    exact(theta, t(-0.25, 3.5))
    # g = (−2, 0): C = (1.2, 1.4) as without wd (u is the raw g); Δ = (−1.25, 1.5);
    # G = (1 + 1.25/1.2, 1 + 1.5/1.4) = (49/24, 29/14); g + wd·θ = (−2.125, 1.75)
    rule.step(theta, t(-2.0, 0.0), worker=1, lag=1)
    g_tilde = t(-2.125 * 24 / 49, 1.75 * 14 / 29)
    torch.testing.assert_close(theta, t(-0.25, 3.5) - 0.5 * g_tilde)


@pytest.mark.parametrize(
    "momentum, nesterov, wd",
    [(0.0, False, 0.0), (0.0, False, 1e-2), (0.9, False, 1e-2), (0.9, True, 1e-2)],
)
def test_gap_aware_without_gap_equals_its_base_rule(momentum, nesterov, wd):
    """Each gradient applied right after its worker was sent θ: Δ = 0, G = 1 (§12)."""
    kw = dict(lr=0.1, weight_decay=wd, warmup_updates=4)
    ga_theta, ref_theta = THETA0.clone(), THETA0.clone()
    ga = GapAware(
        GapAwareConfig(name="ga", momentum=momentum, nesterov=nesterov, **kw), ga_theta, 3
    )
    ref = base_rule(momentum, nesterov, kw, ref_theta)
    for step, g in enumerate(gradients(12)):
        worker = [0, 2, 1][step % 3]
        ga.params_for(ga_theta, worker)
        ga.step(ga_theta, g, worker, lag=3)
        ref.step(ref_theta, g, worker, lag=3)
        exact(ga.penalty, torch.ones_like(g))
        exact(ga_theta, ref_theta)


# ---------------------------------------------------------------- DC-ASGD (§11.1)


@pytest.mark.parametrize(
    "wd, expected",
    [
        # Δ = (−1, 2); g⊙g⊙Δ = (−1, 8); g̃ = (1, −2) + 0.5·(−1, 8) = (0.5, 2);
        # θ = (0, 4) − 0.5·(0.5, 2)
        (0.0, t(-0.25, 3.0)),
        # first θ = (1, 2) − 0.5·(2.5, −3) = (−0.25, 3.5); Δ = (−1.25, 1.5);
        # g̃ = (1, −2) + 0.5·(−1.25, 6) = (0.375, 1); + wd·θ = (0.25, 2.75)
        (0.5, t(-0.375, 2.125)),
    ],
)
def test_dc_asgd_constant_lambda_by_hand(wd, expected):
    theta = t(1.0, 2.0)
    rule = DCASGD(DCASGDConfig(name="dc", lr=0.5, lam=0.5, weight_decay=wd), theta, 2)
    rule.step(theta, t(2.0, -4.0), worker=0, lag=0)  # Δ = 0: a plain SGD step
    rule.params_for(theta, 0)
    rule.step(theta, t(1.0, -2.0), worker=1, lag=1)  # worker 1 still at θ₀ = (1, 2)
    exact(theta, expected)


def test_dc_asgd_adaptive_lambda_by_hand():
    """m = 0.75, λ₀ = 2: λ = λ₀/√(MeanSquare + 1e-7), MeanSquare updated with g first."""
    cfg = DCASGDConfig(name="dc", lr=0.5, adaptive=True, lam0=2.0, ms_decay=0.75)
    theta = t(1.0, 2.0)
    rule = DCASGD(cfg, theta, 2)
    rule.step(theta, t(2.0, -4.0), worker=0, lag=0)  # MS = 0.25·(4, 16) = (1, 4); Δ = 0
    exact(rule.mean_square, t(1.0, 4.0))
    exact(theta, t(0.0, 4.0))
    rule.params_for(theta, 0)
    # g = (1, −2): MS = 0.75·(1, 4) + 0.25·(1, 4) = (1, 4); Δ = (−1, 2); g⊙g⊙Δ = (−1, 8)
    rule.step(theta, t(1.0, -2.0), worker=1, lag=1)
    lam = t(2 / math.sqrt(1 + 1e-7), 2 / math.sqrt(4 + 1e-7))
    g_tilde = t(1.0, -2.0) + lam * t(-1.0, 8.0)  # ≈ (−1, 6)
    torch.testing.assert_close(theta, t(0.0, 4.0) - 0.5 * g_tilde)
    torch.testing.assert_close(theta, t(0.5, 1.0), rtol=0, atol=1e-6)


# ---------------------------------------------------------------- DANA (§9) and Multi-ASGD


def test_dana_look_ahead_by_hand():
    """γ = 0.5, η = 0.5: the look-ahead sent is θ − ηγS, S = Σ_i v_i."""
    theta = t(1.0, 2.0)
    rule = Dana(DanaConfig(name="dana", lr=0.5, momentum=0.5), theta, 2)
    exact(rule.params_for(theta, 0), t(1.0, 2.0))  # S = 0
    rule.step(theta, t(2.0, -4.0), worker=0, lag=0)  # v_0 = (2, −4); θ = (0, 4); S = v_0
    exact(theta, t(0.0, 4.0))
    exact(rule.params_for(theta, 0), t(-0.5, 5.0))  # (0, 4) − 0.25·(2, −4)
    rule.step(theta, t(4.0, 2.0), worker=1, lag=1)  # v_1 = (4, 2); θ = (−2, 3); S = (6, −2)
    exact(theta, t(-2.0, 3.0))
    exact(rule.params_for(theta, 1), t(-3.5, 3.5))  # (−2, 3) − 0.25·(6, −2)
    # worker 0 again: v_0 = 0.5·(2, −4) + (−2, 0) = (−1, −2); θ = (−1.5, 4); S = (3, 0)
    rule.step(theta, t(-2.0, 0.0), worker=0, lag=1)
    exact(theta, t(-1.5, 4.0))
    exact(rule.buf_sum, t(3.0, 0.0))
    exact(rule.params_for(theta, 0), t(-2.25, 4.0))


def test_dana_dc_compensates_against_the_look_ahead_sent():
    """λ = 0.5, γ = 0.5, η = 0.5; θ̂_1 is the look-ahead worker 1 was sent."""
    theta = t(1.0, 2.0)
    rule = Dana(
        DanaConfig(name="dana", lr=0.5, momentum=0.5, variant="dc", dc_lambda=0.5), theta, 2
    )
    rule.params_for(theta, 1)  # θ̂_1 = (1, 2)
    rule.step(theta, t(2.0, -4.0), worker=0, lag=0)  # worker 0 never sent: θ̂_0 = θ₀, Δ = 0
    exact(theta, t(0.0, 4.0))
    # worker 1: Δ = (0, 4) − (1, 2) = (−1, 2); g = (1, −2) + 0.5·(−1, 8) = (0.5, 2) = v_1;
    # θ = (0, 4) − 0.5·(0.5, 2) = (−0.25, 3); S = (2.5, −2)
    rule.step(theta, t(1.0, -2.0), worker=1, lag=1)
    exact(theta, t(-0.25, 3.0))
    exact(rule.params_for(theta, 1), t(-0.875, 3.5))  # (−0.25, 3) − 0.25·(2.5, −2)
    exact(rule.sent[1], t(-0.875, 3.5))


def test_dana_with_zero_momentum_equals_sgd():
    kw = dict(lr=0.1, weight_decay=1e-2, warmup_updates=5)
    dana_theta, sgd_theta = THETA0.clone(), THETA0.clone()
    dana = Dana(DanaConfig(name="dana", momentum=0.0, **kw), dana_theta, 3)
    sgd = SGD(SGDConfig(name="sgd", **kw), sgd_theta, 3)
    for step, g in enumerate(gradients(12)):
        worker = [0, 1, 2, 0, 2, 1][step % 6]
        dana.step(dana_theta, g, worker, lag=2)
        sgd.step(sgd_theta, g, worker, lag=2)
        exact(dana_theta, sgd_theta)
        exact(dana.params_for(dana_theta, worker), sgd_theta)  # no look-ahead


def test_dana_ga_penalises_against_the_look_ahead_sent_by_hand():
    """N = 2, η = 0.5, γ = 0.5, β = 9/16, eps = 0.4; u = the pusher's buffer before its step."""
    cfg = DanaGapAwareConfig(name="dana_ga", lr=0.5, momentum=0.5, beta=0.5625, eps=0.4)
    theta = t(1.0, 2.0)
    rule = DanaGapAware(cfg, theta, 2)
    for w in (0, 1):
        exact(rule.params_for(theta, w), t(1.0, 2.0))  # S = 0: the look-ahead is θ₀
    # worker 0, g = (2, −4): u = v_0 = 0 → C = 0.5·0.4 = 0.2; Δ = θ − θ̂_0 = 0 → G = 1;
    # v_0 = (2, −4), S = (2, −4), θ = (1, 2) − 0.5·(2, −4) = (0, 4)
    rule.step(theta, t(2.0, -4.0), worker=0, lag=0)
    exact(rule.penalty, t(1.0, 1.0))
    exact(theta, t(0.0, 4.0))
    exact(rule.params_for(theta, 0), t(-0.5, 5.0))  # θ − ηγS = (0, 4) − 0.25·(2, −4)
    # worker 1 (sent θ₀), g = (−2, 0): u = v_1 = 0 → C = 0.2; Δ = (0, 4) − (1, 2) = (−1, 2);
    # G = (1 + 1/0.2, 1 + 2/0.2) = (6, 11); v_1 = (−1/3, 0); θ = (0, 4) − 0.5·(−1/3, 0)
    rule.step(theta, t(-2.0, 0.0), worker=1, lag=1)
    torch.testing.assert_close(rule.penalty, t(6.0, 11.0))
    torch.testing.assert_close(theta, t(1 / 6, 4.0))
    torch.testing.assert_close(rule.buf_sum, t(5 / 3, -4.0))


@pytest.mark.parametrize("variant", ["zero", "dc"])
def test_dana_ga_with_an_unbounded_yardstick_is_dana(variant):
    """eps = 1e30 makes C so large that G = 1 exactly: DANA-GA is then DANA, bit for bit."""
    kw = dict(lr=0.1, momentum=0.9, weight_decay=1e-2, warmup_updates=5, variant=variant)
    ga_theta, dana_theta = THETA0.clone(), THETA0.clone()
    ga = DanaGapAware(DanaGapAwareConfig(name="dana_ga", eps=1e30, **kw), ga_theta, 3)
    dana = Dana(DanaConfig(name="dana", **kw), dana_theta, 3)
    for step, g in enumerate(gradients(15)):
        worker = [0, 1, 2, 0, 2, 1, 1][step % 7]
        exact(ga.params_for(ga_theta, worker), dana.params_for(dana_theta, worker))
        ga.step(ga_theta, g, worker, lag=1)
        dana.step(dana_theta, g, worker, lag=1)
        exact(ga_theta, dana_theta)
    exact(ga.penalty, torch.ones_like(ga.penalty))


def test_dana_ga_refuses_the_slim_variant():
    with pytest.raises(ConfigError, match="variant=slim"):
        DanaGapAwareConfig(name="dana_ga", variant="slim")


def test_multi_asgd_equals_dana_zero_without_its_look_ahead():
    kw = dict(lr=0.1, momentum=0.9, weight_decay=1e-2, warmup_updates=5)
    dana_theta, multi_theta = THETA0.clone(), THETA0.clone()
    dana = Dana(DanaConfig(name="dana", **kw), dana_theta, 3)
    multi = MultiMomentum(MultiMomentumConfig(name="multi", **kw), multi_theta, 3)
    for step, g in enumerate(gradients(15)):
        worker = [0, 1, 2, 0, 2, 1, 1][step % 7]
        dana.step(dana_theta, g, worker, lag=1)
        multi.step(multi_theta, g, worker, lag=1)
        exact(dana_theta, multi_theta)
    exact(multi.bufs, dana.bufs)
    torch.testing.assert_close(dana.buf_sum, dana.bufs.sum(0))


def test_multi_asgd_keeps_one_buffer_per_worker_by_hand():
    theta = t(1.0, 2.0)
    rule = MultiMomentum(MultiMomentumConfig(name="multi", lr=0.5, momentum=0.5), theta, 2)
    rule.step(theta, t(2.0, -4.0), worker=0, lag=0)  # v_0 = (2, −4); θ = (0, 4)
    rule.step(theta, t(4.0, 2.0), worker=1, lag=1)  # v_1 = (4, 2); θ = (−2, 3)
    rule.step(theta, t(-2.0, 0.0), worker=0, lag=1)  # v_0 = (−1, −2); θ = (−1.5, 4)
    exact(theta, t(-1.5, 4.0))


class Quadratic:
    """f_w(θ) = ½‖A_w θ − b_w‖²: worker w's fixed shard of a least-squares problem."""

    def __init__(self, num_workers, dim, seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.a = [
            torch.randn(4, dim, generator=gen, dtype=torch.float64) for _ in range(num_workers)
        ]
        self.b = [torch.randn(4, generator=gen, dtype=torch.float64) for _ in range(num_workers)]

    def grad(self, worker, theta):
        a = self.a[worker]
        return a.T @ (a @ theta - self.b[worker])


ARRIVALS = [0, 1, 2, 0, 2, 1, 1, 0, 2, 2, 0, 1, 0, 0, 2, 1, 2, 0, 1, 1, 2, 0, 0, 1, 2]


def test_dana_slim_equals_dana_zero_on_an_asynchronous_schedule():
    """Three workers behind a real ASP parameter server, arriving in a fixed interleaved
    order; each computes its gradient at the parameters it was sent. Zero's workers send g,
    Slim's send `worker_message`; Slim's Φ tracks Zero's look-ahead θ − ηγS (§9.3, §12)."""
    n, problem = 3, Quadratic(3, dim=6)
    servers, inboxes = {}, {}
    for variant in ("zero", "slim"):
        cfg = DanaConfig(name="dana", lr=0.05, momentum=0.9, variant=variant)
        params = t(0.3, -1.2, 0.7, 2.0, -0.4, 1.1)
        servers[variant] = ParameterServer(
            params, ASP(ASPConfig(name="asp"), n), Dana(cfg, params, n), n, lambda *a, **k: None
        )
        # what each worker received, copied as the runtime does (with the version read)
        inboxes[variant] = {
            r.worker: (r.params.clone(), r.version) for r in servers[variant].start(0)
        }
    states = {w: {} for w in range(n)}  # Slim's worker-side momentum
    clocks = [0] * n
    for now, w in enumerate(ARRIVALS, start=1):
        for variant, ps in servers.items():
            read, version = inboxes[variant][w]
            g = problem.grad(w, read)
            message = Dana.worker_message(ps.rule.cfg, g, states[w]) if variant == "slim" else g
            (reply,) = ps.on_push(Push(w, clocks[w], version, message, 0.0, 0.0, 0.0), now)
            inboxes[variant][w] = (reply.params.clone(), reply.version)
        clocks[w] += 1
        zero, slim = servers["zero"], servers["slim"]
        look_ahead = zero.params - zero.rule.lr * zero.rule.cfg.momentum * zero.rule.buf_sum
        torch.testing.assert_close(slim.params, look_ahead, rtol=0, atol=1e-12)
        torch.testing.assert_close(inboxes["slim"][w][0], inboxes["zero"][w][0], rtol=0, atol=1e-12)
    # the schedule was really asynchronous, and the look-ahead really differs from θ
    assert servers["zero"].version == len(ARRIVALS)
    assert (servers["zero"].params - servers["slim"].params).abs().max() > 1e-3


def test_worker_message_is_the_gradient_except_for_slim():
    g = t(1.0, -2.0)
    assert Dana.worker_message(DanaConfig(name="dana"), g, {}) is g
    assert DCASGD.worker_message(DCASGDConfig(name="dc"), g, {}) is g
    state: dict = {}
    slim = DanaConfig(name="dana", momentum=0.5, variant="slim")
    exact(Dana.worker_message(slim, g, state), t(1.5, -3.0))  # v = g; m = 0.5·v + g
    exact(Dana.worker_message(slim, t(2.0, 0.0), state), t(3.25, -0.5))  # v = (2.5, −1)
    exact(state["v"], t(2.5, -1.0))
    exact(g, t(1.0, -2.0))  # the gradient itself is left alone


# ---------------------------------------------------------------- every new rule

NEW_RULES = [
    (StalenessAware, StalenessAwareConfig, {}),
    (StalenessAware, StalenessAwareConfig, {"momentum": 0.9, "nesterov": True}),
    (GapAware, GapAwareConfig, {}),
    (GapAware, GapAwareConfig, {"momentum": 0.9}),
    (DCASGD, DCASGDConfig, {}),
    (DCASGD, DCASGDConfig, {"adaptive": True}),
    (MultiMomentum, MultiMomentumConfig, {}),
    (Dana, DanaConfig, {}),
    (Dana, DanaConfig, {"variant": "slim"}),
    (Dana, DanaConfig, {"variant": "dc"}),
]


@pytest.mark.parametrize("cls, config, extra", NEW_RULES)
def test_warm_up_goes_linearly_from_lr_over_n_to_lr(cls, config, extra):
    theta = THETA0.clone()
    rule = cls(config(name="x", lr=0.4, warmup_updates=4, **extra), theta, 4)
    seen = []
    for step, g in enumerate(gradients(7)):
        seen.append(rule.lr)
        rule.params_for(theta, step % 4)
        rule.step(theta, g, step % 4, lag=1)
    # np.linspace(η/N, η, W) for the first W = 4 updates (η at update W − 1), then η
    assert seen == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4, 0.4, 0.4])
    assert rule.updates == 7


def test_steps_use_the_warm_up_rate():
    """SA at lag 1 takes plain steps: θ moves by exactly −η_k·g with the scheduled η_k."""
    theta = t(0.0)
    rule = StalenessAware(StalenessAwareConfig(name="sa", lr=0.4, warmup_updates=2), theta, 4)
    for _ in range(3):
        rule.step(theta, t(1.0), worker=0, lag=1)
    torch.testing.assert_close(theta, t(-(0.1 + 0.4 + 0.4)))  # W = 2: η/N, then η


def test_dana_look_ahead_uses_the_rate_just_applied():
    theta = t(1.0)
    rule = Dana(DanaConfig(name="dana", lr=0.4, momentum=0.5, warmup_updates=3), theta, 4)
    rule.step(theta, t(1.0), worker=0, lag=0)  # η_0 = 0.1: θ = 0.9, S = 1
    assert rule.lr == pytest.approx(0.25)  # the next update's η_1, not the look-ahead's
    torch.testing.assert_close(rule.params_for(theta, 0), t(0.9 - 0.1 * 0.5 * 1.0))


@pytest.mark.parametrize(
    "name, cls, config",
    [
        ("staleness_aware", StalenessAware, StalenessAwareConfig),
        ("gap_aware", GapAware, GapAwareConfig),
        ("dc_asgd", DCASGD, DCASGDConfig),
        ("multi_momentum", MultiMomentum, MultiMomentumConfig),
        ("dana", Dana, DanaConfig),
    ],
)
def test_registered_under_the_documented_name(name, cls, config):
    assert UPDATES.get(name) == (cls, config)
    assert issubclass(config, UpdateConfig)


def test_per_worker_flags():
    assert not StalenessAware.per_worker
    assert GapAware.per_worker and DCASGD.per_worker
    assert MultiMomentum.per_worker and Dana.per_worker


@pytest.mark.parametrize("cls, config, extra", [r for r in NEW_RULES if r[0].per_worker])
def test_per_worker_rules_refuse_a_rounds_mean_gradient(cls, config, extra):
    theta = THETA0.clone()
    rule = cls(config(name="x", **extra), theta, 2)
    with pytest.raises(ValueError, match="per-worker state.*got -1"):
        rule.step(theta, torch.ones_like(theta), worker=-1, lag=0)


@pytest.mark.parametrize(
    "config, field, value",
    [
        (StalenessAwareConfig, "momentum", 1.0),
        (StalenessAwareConfig, "nesterov", True),  # without momentum
        (StalenessAwareConfig, "lr", -0.1),
        (GapAwareConfig, "beta", 1.0),
        (GapAwareConfig, "eps", 0.0),
        (GapAwareConfig, "momentum", -0.5),
        (DCASGDConfig, "lam", -1.0),
        (DCASGDConfig, "lam0", float("inf")),
        (DCASGDConfig, "ms_decay", 1.5),
        (DCASGDConfig, "weight_decay", -1e-4),
        (MultiMomentumConfig, "momentum", 1.0),
        (DanaConfig, "momentum", -0.1),
        (DanaConfig, "variant", "lite"),
        (DanaConfig, "dc_lambda", -2.0),
        (DanaConfig, "warmup_updates", -1),
    ],
)
def test_bad_config_names_the_key_and_the_value(config, field, value):
    with pytest.raises(ConfigError, match=rf"algorithm\.update\.{field}\b.*{value!s}"):
        config(name="x", **{field: value})
