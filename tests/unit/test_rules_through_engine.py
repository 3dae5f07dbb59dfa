"""Update rules that read the lag or per-worker state, driven through the parameter-server
state machine (not called directly): each scenario is built by hand and its expected θ
computed by hand, so a server that passes the rule a wrong lag or a wrong worker fails."""

import math

import pytest
import torch

from stalebench.algorithms.barriers import ASP, BSP, ASPConfig, BSPConfig
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
from stalebench.engines.ps import ParameterServer, Push


def asp_server(rule_cls, cfg, n):
    params = torch.zeros(2)
    return ParameterServer(
        params, ASP(ASPConfig(name="asp"), n), rule_cls(cfg, params, n), n, lambda *a, **k: None
    )


def push(w, clock, version, grad):
    return Push(w, clock, version, torch.tensor(grad), loss=1.0, compute_s=0.1, rtt_s=0.0)


def test_staleness_aware_divides_by_the_lag_the_server_counts():
    # four workers read θ₀; their pushes arrive in order, so their lags are 0, 1, 2, 3 and
    # SA divides the steps by max(lag, 1) = 1, 1, 2, 3
    ps = asp_server(StalenessAware, StalenessAwareConfig(name="staleness_aware", lr=1.0), 4)
    ps.start(0.0)
    for w in range(4):
        ps.on_push(push(w, 0, 0, [6.0, 0.0]), 1.0 + w)
    torch.testing.assert_close(ps.params, torch.tensor([-(6 + 6 + 3 + 2.0), 0.0]))
    # worker 0 read version 1 after its push; three updates later its lag is 3
    ps.on_push(push(0, 1, 1, [0.0, 6.0]), 9.0)
    torch.testing.assert_close(ps.params, torch.tensor([-17.0, -2.0]))


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_dc_asgd_compensates_with_what_that_worker_read(order):
    # both read θ₀ = 0; the first push moves θ by its gradient (no gap yet); the second
    # worker's θ̂ is still θ₀, so its gap is θ₁ − θ₀ = −g_first and
    # g̃ = g + λ·g⊙g⊙gap; with g_first = [1, 0], g_second = [1, 1], λ = 0.5:
    # g̃ = [1 − 0.5, 1] and θ₂ = [−1.5, −1]
    ps = asp_server(DCASGD, DCASGDConfig(name="dc_asgd", lr=1.0, lam=0.5), 2)
    ps.start(0.0)
    first, second = order
    ps.on_push(push(first, 0, 0, [1.0, 0.0]), 1.0)
    ps.on_push(push(second, 0, 0, [1.0, 1.0]), 2.0)
    torch.testing.assert_close(ps.params, torch.tensor([-1.5, -1.0]))
    # the first worker was sent θ₁ after its push: its next gradient, computed there, has
    # gap θ₂ − θ₁ = [−0.5, −1]; g = [2, 2] gives g̃ = [2 − 1, 2 − 2] = [1, 0]
    ps.on_push(push(first, 1, 1, [2.0, 2.0]), 3.0)
    torch.testing.assert_close(ps.params, torch.tensor([-2.5, -1.0]))


def test_multi_momentum_keeps_a_buffer_per_worker_the_server_names():
    # γ = 0.5, η = 1: worker 0 pushes [1, 0] twice, worker 1 pushes [0, 1] between; each
    # buffer sees only its own worker: v₀ = [1, 0] then [1.5, 0], v₁ = [0, 1]
    ps = asp_server(
        MultiMomentum, MultiMomentumConfig(name="multi_momentum", lr=1.0, momentum=0.5), 2
    )
    ps.start(0.0)
    ps.on_push(push(0, 0, 0, [1.0, 0.0]), 1.0)
    ps.on_push(push(1, 0, 0, [0.0, 1.0]), 2.0)
    ps.on_push(push(0, 1, 1, [1.0, 0.0]), 3.0)
    torch.testing.assert_close(ps.params, torch.tensor([-2.5, -1.0]))


def test_gap_aware_penalises_by_the_gap_from_what_that_worker_read():
    # β = 0.5, η = 1. Worker 0's g = [2, 2] meets no gap: θ₁ = [−2, −2]. Worker 1's
    # g = [1, 0], computed on θ₀: the EMA of u² is [1.5, 1], bias-corrected by 1 − 0.25
    # to [2, 4/3], so C = [√2, √(4/3)]; its gap is |θ₁ − θ₀| = [2, 2] and
    # G = 1 + 2/C; the first coordinate moves by 1/(1 + √2) = √2 − 1
    cfg = GapAwareConfig(name="gap_aware", lr=1.0, beta=0.5)
    ps = asp_server(GapAware, cfg, 2)
    ps.start(0.0)
    ps.on_push(push(0, 0, 0, [2.0, 2.0]), 1.0)
    ps.on_push(push(1, 0, 0, [1.0, 0.0]), 2.0)
    expected = torch.tensor([-2.0 - (math.sqrt(2) - 1), -2.0])
    torch.testing.assert_close(ps.params, expected)
    g = 1 + 2 / torch.tensor([math.sqrt(2), math.sqrt(4 / 3)])
    torch.testing.assert_close(ps.rule.penalty, g)
    # each worker's θ̂ is what the server last sent that worker: θ₁ to 0, θ₂ to 1
    torch.testing.assert_close(ps.rule.sent[0], torch.tensor([-2.0, -2.0]))
    torch.testing.assert_close(ps.rule.sent[1], expected)


def test_dana_zero_keeps_a_buffer_per_worker_and_sends_the_look_ahead():
    # γ = 0.5, η = 1; each reply is θ − ηγS, S the sum of the workers' buffers:
    # w0 g=[1,0]: v0=[1,0], S=[1,0], θ=[−1,0], sent θ − 0.5·S = [−1.5, 0]
    # w1 g=[0,1]: v1=[0,1], S=[1,1], θ=[−1,−1], sent [−1.5, −1.5]
    # w0 g=[1,0]: v0=[1.5,0], S=[1.5,1], θ=[−2.5,−1], sent [−3.25, −1.5]
    ps = asp_server(Dana, DanaConfig(name="dana", lr=1.0, momentum=0.5), 2)
    assert [r.params.tolist() for r in ps.start(0.0)] == [[0.0, 0.0], [0.0, 0.0]]
    sent = []
    for w, clock, version, g in [
        (0, 0, 0, [1.0, 0.0]),
        (1, 0, 0, [0.0, 1.0]),
        (0, 1, 1, [1.0, 0.0]),
    ]:
        (reply,) = ps.on_push(push(w, clock, version, g), 1.0)
        assert reply.worker == w
        sent.append(reply.params.tolist())
    assert sent == [[-1.5, 0.0], [-1.5, -1.5], [-3.25, -1.5]]
    torch.testing.assert_close(ps.params, torch.tensor([-2.5, -1.0]))


def test_dana_dc_compensates_against_the_look_ahead_that_worker_was_sent():
    # γ = 0.5, η = 1, λ = 1; g̃ = g + λ·g⊙g⊙(θ − θ̂_i), θ̂_i the look-ahead sent to worker i
    # (θ₀ = 0 until sent), then the zero variant's buffers:
    # w0 g=[1,0]: gap 0, v0=[1,0], θ=[−1,0], sent θ̂0 = θ − 0.5·S = [−1.5, 0]
    # w1 g=[1,1]: gap θ − θ₀ = [−1,0], g̃ = [1−1, 1] = [0,1]; v1=[0,1], θ=[−1,−1],
    #   θ̂1 = [−1.5, −1.5]
    # w0 g=[2,2]: gap θ − θ̂0 = [0.5, −1], g̃ = [2 + 4·0.5, 2 − 4] = [4, −2];
    #   v0 = [0.5 + 4, −2], S = [4.5, −1], θ = [−5.5, 1], θ̂0 = [−7.75, 1.5]
    cfg = DanaConfig(name="dana", lr=1.0, momentum=0.5, variant="dc", dc_lambda=1.0)
    ps = asp_server(Dana, cfg, 2)
    ps.start(0.0)
    sent = []
    for w, clock, version, g in [
        (0, 0, 0, [1.0, 0.0]),
        (1, 0, 0, [1.0, 1.0]),
        (0, 1, 1, [2.0, 2.0]),
    ]:
        (reply,) = ps.on_push(push(w, clock, version, g), 1.0)
        sent.append(reply.params.tolist())
    assert sent == [[-1.5, 0.0], [-1.5, -1.5], [-7.75, 1.5]]
    torch.testing.assert_close(ps.params, torch.tensor([-5.5, 1.0]))
    torch.testing.assert_close(ps.rule.bufs, torch.tensor([[4.5, -2.0], [0.0, 1.0]]))


def test_dana_ga_penalises_by_the_gap_from_that_workers_look_ahead():
    # γ = 0.5, η = 1, β = 0.5, eps = 1e-8. Before each step the EMA of u² sees the pushing
    # worker's buffer v_i; G = 1 + |θ − θ̂_i| / C, C = √(EMA / (1 − β^k)) + eps.
    # w0 g=[2,2]: no gap, G = 1: v0 = [2,2], θ = [−2,−2], θ̂0 = θ − 0.5·S = [−3,−3]
    # w0 g=[1,0]: EMA = 0.5·v0² = [2,2], k = 2, C = √(2/0.75); gap = [1,1], G = 1 + 1/C;
    #   v0 = [1 + 1/G, 1], θ = [−3 − 1/G, −3]
    # w1 g=[1,1]: EMA = 0.5·[2,2] + 0.5·v1² (v1 = 0) = [1,1], k = 3, C' = √(1/0.875);
    #   θ̂1 = θ₀ = 0, gap = [3 + 1/G, 3]; v1 = g / G', θ ← θ − v1
    cfg = DanaGapAwareConfig(name="dana_ga", lr=1.0, momentum=0.5, beta=0.5, eps=1e-8)
    ps = asp_server(DanaGapAware, cfg, 2)
    ps.start(0.0)
    ps.on_push(push(0, 0, 0, [2.0, 2.0]), 1.0)
    ps.on_push(push(0, 1, 1, [1.0, 0.0]), 2.0)
    c = math.sqrt(2 / 0.75) + 1e-8
    g = 1 + 1 / c
    torch.testing.assert_close(ps.rule.penalty, torch.tensor([g, g]))
    torch.testing.assert_close(ps.params, torch.tensor([-3 - 1 / g, -3.0]))
    ps.on_push(push(1, 0, 0, [1.0, 1.0]), 3.0)
    c1 = math.sqrt(1 / 0.875) + 1e-8
    g1 = torch.tensor([1 + (3 + 1 / g) / c1, 1 + 3 / c1])
    torch.testing.assert_close(ps.rule.penalty, g1)
    torch.testing.assert_close(ps.params, torch.tensor([-3 - 1 / g, -3.0]) - 1 / g1)


def test_a_rounds_mean_gradient_reaches_the_rule_as_worker_minus_1():
    # BSP per_round averages a round's gradients; the mean belongs to no worker, so a rule
    # with per-worker state (here Multi-ASGD, which the engine's validation keeps away from
    # per_round) is handed worker −1 and refuses it instead of using some worker's slot
    params = torch.zeros(2)
    n = 2
    rule = MultiMomentum(MultiMomentumConfig(name="multi_momentum", lr=1.0), params, n)
    barrier = BSP(BSPConfig(name="bsp", apply="per_round"), n)
    ps = ParameterServer(params, barrier, rule, n, lambda *a, **k: None)
    ps.start(0.0)
    ps.on_push(push(0, 0, 0, [1.0, 0.0]), 1.0)
    with pytest.raises(ValueError, match=r"needs a worker in \[0, 2\), got -1 "):
        ps.on_push(push(1, 0, 0, [0.0, 1.0]), 2.0)
