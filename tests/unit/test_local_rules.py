"""The local-update rules against their definitions: each outer rule's θ and replica
updates written out by hand, the inner optimizers against torch's own, and the wire."""

from __future__ import annotations

import pytest
import torch

from stalebench.algorithms.local import (
    INNER,
    OUTER,
    AdamWConfig,
    ElasticConfig,
    InnerConfig,
    LeaderConfig,
    MomentumConfig,
    NesterovConfig,
    OuterConfig,
)
from stalebench.engines.local.round import Wire
from stalebench.errors import ConfigError


def vec(*values):
    return torch.tensor(values, dtype=torch.float32)


def test_average_is_the_mean_of_the_replicas():
    theta = vec(1.0, 2.0)
    xs = [vec(0.0, 2.0), vec(1.0, 1.0), vec(2.0, 3.0)]
    rule = OUTER.build(OuterConfig(name="average"), theta, 3)
    mean_delta = sum(theta - x for x in xs) / 3
    rule.step(theta, mean_delta)
    torch.testing.assert_close(theta, vec(1.0, 2.0))  # mean of xs
    x = xs[0].clone()
    rule.replica(x, vec(1.0, 0.0), theta)
    assert torch.equal(x, theta)  # restarts from θ


def test_nesterov_is_torch_sgd_with_nesterov_on_the_pseudo_gradient():
    cfg = NesterovConfig(name="nesterov", lr=0.7, momentum=0.9)
    theta = vec(1.0, -1.0, 0.5)
    ref = theta.clone().requires_grad_(False)
    opt = torch.optim.SGD([ref], lr=0.7, momentum=0.9, nesterov=True)
    rule = OUTER.build(cfg, theta, 4)
    for delta in (vec(0.1, 0.2, -0.3), vec(-0.2, 0.05, 0.1), vec(0.3, 0.3, 0.3)):
        rule.step(theta, delta)
        ref.grad = delta.clone()
        opt.step()
        torch.testing.assert_close(theta, ref, rtol=0, atol=1e-7)


def test_nesterov_by_hand_two_rounds():
    # b1 = Δ1; θ1 = θ0 − η(Δ1 + μ b1); b2 = μ b1 + Δ2; θ2 = θ1 − η(Δ2 + μ b2)
    eta, mu = 0.5, 0.8
    theta = vec(2.0)
    rule = OUTER.build(NesterovConfig(name="nesterov", lr=eta, momentum=mu), theta, 2)
    rule.step(theta, vec(1.0))
    assert theta.item() == pytest.approx(2.0 - eta * (1.0 + mu * 1.0))
    rule.step(theta, vec(-1.0))
    b2 = mu * 1.0 - 1.0
    assert theta.item() == pytest.approx(2.0 - eta * 1.8 - eta * (-1.0 + mu * b2))


def test_nesterov_without_momentum_and_unit_lr_is_average_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(50, generator=gen), None
    b = a.clone()
    avg = OUTER.build(OuterConfig(name="average"), a, 3)
    nest = OUTER.build(NesterovConfig(name="nesterov", lr=1.0, momentum=0.0), b, 3)
    for _ in range(5):
        delta = torch.randn(50, generator=gen)
        avg.step(a, delta)
        nest.step(b, delta)
        assert torch.equal(a, b)


def test_elastic_moves_replicas_and_centre_toward_each_other():
    alpha, centre = 0.2, vec(0.0, 0.0)
    xs = [vec(1.0, 0.0), vec(0.0, 2.0)]
    rule = OUTER.build(ElasticConfig(name="elastic", alpha=alpha), centre, 2)
    deltas = [centre - x for x in xs]
    old = centre.clone()
    rule.step(centre, sum(deltas) / 2)
    # x̃ ← x̃ + α Σ (x_i − x̃)
    torch.testing.assert_close(centre, old + alpha * sum(x - old for x in xs))
    for x, d in zip(xs, deltas, strict=True):
        expected = x - alpha * (x - old)  # x_i ← x_i − α(x_i − x̃), x̃ the old centre
        rule.replica(x, d, centre)
        torch.testing.assert_close(x, expected)


def test_leader_pulls_toward_the_lowest_loss_and_leaves_the_leader():
    cfg = LeaderConfig(name="leader", pull=0.25)
    theta = vec(0.0)
    rule = OUTER.build(cfg, theta, 3)
    leaders, best = rule.leaders([0.5, 0.2, 0.9])
    assert (leaders, best) == ([1], 0)
    params = torch.stack([vec(4.0)])
    x0, x1 = vec(0.0), vec(4.0)
    rule.pull(x0, 0, leaders, best, params)
    rule.pull(x1, 1, leaders, best, params)
    assert x0.item() == pytest.approx(0.0 - 0.25 * (0.0 - 4.0))
    assert x1.item() == 4.0


def test_leader_groups_local_and_global_pull_from_the_same_replica():
    cfg = LeaderConfig(name="leader", pull=0.5, groups=2, global_pull=0.25)
    rule = OUTER.build(cfg, vec(0.0), 5)
    assert [list(g) for g in rule.groups()] == [[0, 1], [2, 3, 4]]
    leaders, best = rule.leaders([0.3, 0.4, 0.9, 0.1, 0.1])  # ties: lowest index
    assert (leaders, best) == ([0, 3], 1)
    params = torch.stack([vec(2.0), vec(10.0)])
    x = vec(4.0)  # worker 1, group 0
    rule.pull(x, 1, leaders, best, params)
    # x − λ(x − x_l) − λ_G(x − x_g), both from the x before the pulls
    assert x.item() == pytest.approx(4.0 - 0.5 * (4.0 - 2.0) - 0.25 * (4.0 - 10.0))
    x = vec(2.0)  # worker 0 leads group 0 but not globally
    rule.pull(x, 0, leaders, best, params)
    assert x.item() == pytest.approx(2.0 - 0.25 * (2.0 - 10.0))
    x = vec(10.0)  # worker 3 leads all
    rule.pull(x, 3, leaders, best, params)
    assert x.item() == 10.0


@pytest.mark.parametrize(
    ("cfg", "make"),
    [
        (InnerConfig(name="sgd", lr=0.1, weight_decay=0.01),
         lambda p: torch.optim.SGD([p], lr=0.1, weight_decay=0.01)),
        (MomentumConfig(name="momentum", lr=0.1, momentum=0.8, nesterov=True, weight_decay=0.05),
         lambda p: torch.optim.SGD([p], lr=0.1, momentum=0.8, nesterov=True, weight_decay=0.05)),
        (AdamWConfig(name="adamw", lr=0.01, eps=0.5),
         lambda p: torch.optim.AdamW([p], lr=0.01, betas=(0.9, 0.95), eps=0.5, weight_decay=0.1)),
    ],
    ids=["sgd", "momentum", "adamw"],
)  # fmt: skip
def test_inner_optimizers_are_torchs(cfg, make):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(20, generator=gen)
    ref = torch.nn.Parameter(x.clone())
    inner, opt = INNER.build(cfg, x), make(ref)
    for _ in range(4):
        g = torch.randn(20, generator=gen)
        inner.step(g.clone())
        ref.grad = g.clone()
        opt.step()
    torch.testing.assert_close(x, ref.detach(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("reset", [False, True])
def test_inner_state_is_kept_across_rounds_unless_reset(reset):
    x = vec(1.0)
    inner = INNER.build(MomentumConfig(name="momentum", lr=1.0, momentum=0.5, reset=reset), x)
    inner.step(vec(1.0))  # b = 1, x = 0
    inner.new_round()
    inner.step(vec(1.0))  # kept: b = 0.5 + 1 = 1.5; reset: b = 1
    assert x.item() == (-1.0 if reset else -1.5)


def test_wire_none_is_bit_exact_and_fp16_loses_little():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(2))
    none, half = Wire("none", [(0, 1000)]), Wire("fp16", [(0, 1000)])
    assert torch.equal(none.decode(none.encode(x)), x) and none.error(x) == 0.0
    assert half.encode(x).dtype == torch.float16 and half.nbytes(1000) == 2000
    assert 0.0 < half.error(x) < 1e-3


def test_int8_scales_each_tensor_by_its_largest_value():
    from stalebench.engines.local.round import segments

    gen = torch.Generator().manual_seed(3)
    x = torch.cat([torch.randn(300, generator=gen) * 100, torch.randn(700, generator=gen) * 0.01])
    wire = Wire("int8", segments([300, 700], slice(0, 1000)))
    packed = wire.encode(x)
    assert packed.dtype == torch.int8 and packed.numel() == wire.nbytes(1000) == 1000 + 2 * 4
    back = wire.decode(packed)
    for a, b in ((0, 300), (300, 1000)):  # each tensor within half a step of its own scale
        step = float(x[a:b].abs().max()) / 127
        assert float((back[a:b] - x[a:b]).abs().max()) <= step / 2 + 1e-6
    assert 0.0 < wire.error(x) < 0.01
    zero = Wire("int8", [(0, 4)])
    assert torch.equal(zero.decode(zero.encode(torch.zeros(4))), torch.zeros(4))


def test_segments_cut_the_tensors_by_the_fragment():
    from stalebench.engines.local.round import segments

    assert segments([3, 4, 5], slice(0, 12)) == [(0, 3), (3, 7), (7, 12)]
    assert segments([3, 4, 5], slice(5, 9)) == [(0, 2), (2, 4)]


BAD = [
    (OuterConfig, "average", {"inner_steps": 0}, "outer.inner_steps must be >= 1, got 0"),
    (NesterovConfig, "nesterov", {"momentum": 1.0}, "outer.momentum must be in [0, 1), got 1.0"),
    (NesterovConfig, "nesterov", {"lr": 0.0}, "outer.lr must be > 0, got 0.0"),
    (ElasticConfig, "elastic", {"alpha": -0.1}, "outer.alpha must be in [0, 1], got -0.1"),
    (ElasticConfig, "elastic", {"alpha": 1.5}, "outer.alpha must be in [0, 1], got 1.5"),
    (LeaderConfig, "leader", {"pull": 1.5}, "outer.pull must be in [0, 1], got 1.5"),
    (
        LeaderConfig,
        "leader",
        {"global_pull": -0.1},
        "outer.global_pull must be in [0, 1], got -0.1",
    ),
    (LeaderConfig, "leader", {"groups": 0}, "outer.groups must be >= 1, got 0"),
    (InnerConfig, "sgd", {"lr": -1.0}, "inner.lr must be > 0, got -1.0"),
    (InnerConfig, "sgd", {"weight_decay": -1.0}, "inner.weight_decay must be >= 0, got -1.0"),
    (MomentumConfig, "momentum", {"momentum": 1.0}, "inner.momentum must be in [0, 1), got 1.0"),
    (AdamWConfig, "adamw", {"beta2": 1.0}, "inner.beta2 must be in [0, 1), got 1.0"),
    (AdamWConfig, "adamw", {"beta1": -0.1}, "inner.beta1 must be in [0, 1), got -0.1"),
    (AdamWConfig, "adamw", {"eps": 0.0}, "inner.eps must be > 0, got 0.0"),
]


@pytest.mark.parametrize(("cls", "name", "kwargs", "message"), BAD)
def test_bad_settings_name_the_key_and_value(cls, name, kwargs, message):
    with pytest.raises(ConfigError) as err:
        cls(name=name, **kwargs)
    assert str(err.value) == f"algorithm.{message}"


def test_elastic_alpha_defaults_to_the_papers_beta_over_n():
    centre = vec(0.0)
    rule = OUTER.build(ElasticConfig(name="elastic"), centre, 4)
    rule.step(centre, vec(-1.0))  # mean Δ = −1: the replicas sit 1 above the centre
    assert centre.item() == pytest.approx(0.9)  # x̃ + β·(mean x − x̃), β = Nα = 0.9
    x = vec(1.0)
    rule.replica(x, vec(-1.0), centre)
    assert x.item() == pytest.approx(1.0 - 0.9 / 4)


def test_sync_sends_and_merges_every_h_steps():
    from stalebench.engines.local.round import Plan

    plan = Plan("sync", 4, 1, 0, 10)
    assert [s for s in range(1, 13) if plan.sends(s)] == [4, 8, 12]
    assert [s for s in range(1, 13) if plan.merges(s)] == [4, 8, 12]
    assert plan.part(0) == slice(0, 10)


def test_streaming_fragments_are_staggered_and_merged_after_the_delay():
    from stalebench.engines.local.round import Plan

    plan = Plan("streaming", 10, 2, 3, 11)
    assert [plan.part(0), plan.part(1)] == [slice(0, 5), slice(5, 11)]
    sends = {s: plan.sends(s) for s in range(1, 21) if plan.sends(s)}
    assert sends == {5: [0], 10: [1], 15: [0], 20: [1]}
    merges = {s: plan.merges(s) for s in range(1, 24) if plan.merges(s)}
    assert merges == {8: [0], 13: [1], 18: [0], 23: [1]}
    assert Plan("sync", 10, 2, 3, 11).fragments == 1  # fragments and delay: streaming only


def test_overlap_merges_a_round_later():
    from stalebench.engines.local.round import Plan

    plan = Plan("overlap", 5, 1, 0, 3)
    assert plan.delay == 5 and plan.keeps_progress
    assert [s for s in range(1, 16) if plan.merges(s)] == [10, 15]


def test_merges_keep_the_steps_since_the_send_or_mix_by_alpha():
    from types import SimpleNamespace

    from stalebench.engines.local.round import Exchange

    job = SimpleNamespace(
        num_workers=2,
        cfg=SimpleNamespace(algorithm=SimpleNamespace(outer=OuterConfig(name="average"))),
    )
    ex = Exchange(job, vec(0.0), Wire("none", [(0, 1)]))
    # sent at θ = 1 with x_sent = 0.5 (Δ = 0.5); since then x moved to 0.25; θ became 0.4
    x = vec(0.25)
    ex.merge(x, vec(0.5), vec(0.4), None, 0, before=vec(1.0), alpha=0.0)
    assert x.item() == pytest.approx(0.4 + (0.25 - 0.5))  # θ_new + steps since the send
    x = vec(0.25)
    ex.merge(x, vec(0.5), vec(0.4), None, 0, before=None, alpha=0.25)
    assert x.item() == pytest.approx(0.75 * 0.4 + 0.25 * 0.25)  # (1 − α)θ + αx
    x = vec(0.25)
    ex.merge(x, vec(0.5), vec(0.4), None, 0, before=None, alpha=0.0)
    assert x.item() == pytest.approx(0.4)


def test_delayed_nesterov_folds_momentum_in_every_n_steps():
    eta, mu = 0.5, 0.8
    theta = vec(0.0)
    rule = OUTER.build(NesterovConfig(name="nesterov", lr=eta, momentum=mu, delay=3), theta, 4)
    rule.step(theta, vec(1.0))  # plain
    rule.step(theta, vec(2.0))  # plain
    assert theta.item() == pytest.approx(-eta * 3.0)
    rule.step(theta, vec(3.0))  # b = 1 + 2 + 3; θ −= η(3 + μ·6)
    assert theta.item() == pytest.approx(-eta * 3.0 - eta * (3.0 + mu * 6.0))
    rule.step(theta, vec(1.0))  # plain again, the buffer kept
    assert theta.item() == pytest.approx(-eta * 3.0 - eta * (3.0 + mu * 6.0) - eta * 1.0)
    assert rule.buf.item() == pytest.approx(6.0)


def test_delayed_nesterov_with_delay_one_is_nesterov_bit_for_bit():
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(40, generator=gen)
    b = a.clone()
    plain = OUTER.build(NesterovConfig(name="nesterov"), a, 4)
    delayed = OUTER.build(NesterovConfig(name="nesterov", delay=1), b, 4)
    for _ in range(5):
        d = torch.randn(40, generator=gen)
        plain.step(a, d)
        delayed.step(b, d)
    assert torch.equal(a, b)


def test_the_ends_of_the_ranges_are_accepted():
    assert OuterConfig(name="average", inner_steps=1).inner_steps == 1
    assert ElasticConfig(name="elastic", alpha=1.0).alpha == 1.0
    assert LeaderConfig(name="leader", pull=1.0, global_pull=1.0).pull == 1.0


def test_delayed_nesterov_every_second_step():
    theta = vec(0.0)
    rule = OUTER.build(NesterovConfig(name="nesterov", lr=1.0, momentum=0.5, delay=2), theta, 2)
    rule.step(theta, vec(1.0))  # plain: the first step is not a momentum step
    assert theta.item() == -1.0 and rule.buf.item() == 0.0
    rule.step(theta, vec(1.0))  # b = 2; θ −= 1 + 0.5·2
    assert theta.item() == -3.0 and rule.buf.item() == 2.0


def test_the_leader_rule_takes_no_mean_step():
    rule = OUTER.build(LeaderConfig(name="leader"), vec(0.0), 2)
    with pytest.raises(
        TypeError, match="^outer=leader exchanges the leaders' replicas, not a mean Δ$"
    ):
        rule.step(vec(0.0), vec(1.0))


@pytest.mark.parametrize("wire", ["none", "fp16"])
def test_a_round_over_the_replicas_left_is_their_mean(wire):
    # 4 replicas, 3 left: each puts Δ_i / 4 on the wire (as with all four), the payload sums
    # the three, and the outer step takes their mean (share 4/3), not 3/4 of it
    from types import SimpleNamespace

    from stalebench.engines.local.round import Exchange

    job = SimpleNamespace(
        num_workers=4,
        cfg=SimpleNamespace(algorithm=SimpleNamespace(outer=OuterConfig(name="average"))),
    )
    ex = Exchange(job, vec(0.0, 0.0), Wire(wire, [(0, 2)]))
    deltas = {0: vec(0.5, -1.0), 1: vec(0.25, 2.0), 3: vec(1.0, 0.5)}
    total = sum(ex.contribution(w, d) for w, d in deltas.items())
    theta = vec(1.0, 1.0)
    ex.new_theta(theta, total, 4 / 3)
    mean = torch.stack(list(deltas.values())).mean(0)
    torch.testing.assert_close(theta, vec(1.0, 1.0) - mean, rtol=1e-3, atol=1e-3)
