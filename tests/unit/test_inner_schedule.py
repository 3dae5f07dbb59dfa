"""The inner optimizers' step schedule (algorithm.inner.lr_decay): its values, the step each
inner step takes through torch's LambdaLR, and the default (none) left exactly as it was —
a bare torch optimizer, no scheduler."""

import math

import pytest
import torch

from stalebench.algorithms.local import (
    INNER,
    AdamWConfig,
    InnerConfig,
    MomentumConfig,
    lr_factor,
)


def test_the_schedules_values():
    assert [lr_factor("none", k, 0) for k in (0, 1, 10**6)] == [1.0, 1.0, 1.0]
    # inverse_sqrt: 1/√(1 + k/T): 1 at the start, halved at k = 3T, a quarter at 15T
    assert [lr_factor("inverse_sqrt", k, 10) for k in (0, 30, 150)] == [1.0, 0.5, 0.25]
    assert lr_factor("inverse_sqrt", 10, 10) == pytest.approx(1 / math.sqrt(2))
    # cosine: ½(1 + cos(πk/T)) from 1 to 0 at k = T, and 0 after it
    assert [lr_factor("cosine", k, 8) for k in (0, 4, 8, 9, 100)] == pytest.approx(
        [1.0, 0.5, 0.0, 0.0, 0.0], abs=1e-15
    )
    assert lr_factor("cosine", 2, 8) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))


@pytest.mark.parametrize("decay", ["inverse_sqrt", "cosine"])
def test_each_plain_sgd_step_moves_by_the_scheduled_step(decay):
    x = torch.zeros(4, dtype=torch.float64)
    opt = INNER.build(InnerConfig(name="sgd", lr=0.5, lr_decay=decay, lr_decay_steps=6), x)
    grad = torch.ones(4, dtype=torch.float64)
    for k in range(12):
        expected = 0.5 * lr_factor(decay, k, 6)
        assert opt.lr == pytest.approx(expected, rel=1e-15)
        before = x.clone()
        opt.step(grad)
        torch.testing.assert_close(before - x, grad * expected, rtol=1e-12, atol=1e-15)


def test_the_schedule_scales_momentum_and_adamw_too():
    for cfg in (
        MomentumConfig(name="momentum", lr=0.2, nesterov=True, lr_decay="cosine", lr_decay_steps=5),
        AdamWConfig(name="adamw", lr=1e-3, lr_decay="inverse_sqrt", lr_decay_steps=5),
    ):
        opt = INNER.build(cfg, torch.zeros(3))
        lrs = []
        for _ in range(7):
            lrs.append(opt.lr)
            opt.step(torch.ones(3))
        assert lrs == pytest.approx([cfg.lr * lr_factor(cfg.lr_decay, k, 5) for k in range(7)])


def test_a_rounds_reset_keeps_the_schedule_going():
    cfg = MomentumConfig(name="momentum", lr=0.1, reset=True, lr_decay="cosine", lr_decay_steps=4)
    opt = INNER.build(cfg, torch.zeros(2))
    for _ in range(2):
        opt.step(torch.ones(2))
    opt.new_round()  # the momentum goes, the count of inner steps stays
    assert not opt.opt.state and opt.lr == pytest.approx(0.1 * lr_factor("cosine", 2, 4))


@pytest.mark.parametrize(
    "cfg, torch_opt",
    [
        (
            InnerConfig(name="sgd", lr=0.3, weight_decay=0.01),
            lambda x: torch.optim.SGD([x], lr=0.3, weight_decay=0.01, foreach=False),
        ),
        (
            MomentumConfig(name="momentum", lr=0.05, nesterov=True, weight_decay=1e-4),
            lambda x: torch.optim.SGD(
                [x], lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4, foreach=False
            ),
        ),
        (
            AdamWConfig(name="adamw"),
            lambda x: torch.optim.AdamW(
                [x], lr=4e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=False
            ),
        ),
    ],
    ids=["sgd", "momentum", "adamw"],
)
def test_the_default_is_the_bare_torch_optimizer_bit_for_bit(cfg, torch_opt):
    assert cfg.lr_decay == "none" and cfg.lr_decay_steps == 0
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(64, generator=gen) for _ in range(30)]
    ours = torch.randn(64, generator=gen)
    theirs = ours.clone()
    opt = INNER.build(cfg, ours)
    assert opt.schedule is None  # no scheduler: the step is the constant lr, untouched
    bare = torch_opt(theirs)
    for g in grads:
        opt.step(g.clone())
        theirs.grad = g.clone()
        bare.step()
    assert torch.equal(ours, theirs)
    assert opt.lr == cfg.lr
