"""A pipeline stage's numbers and the Adam-family stage optimizers, pinned where mutation
testing found them loose: the mean of a flushed step's microbatch gradients, clipping and
the update's reported norm and gap, the first stage's missing input gradient, a stage's
device, and the per-step η, β₁ and the config's ε reaching torch.optim.

The stages here are one bias-free `Linear` (or one `Embedding`) stepped by Nesterov-PP with
γ = 0 and no discount, i.e. plain w ← w − η·g, so every expected value is worked out by hand
(docs/algorithms.md §10.2, §10.7); the Adam family is checked against torch.optim."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from stalebench.algorithms.pipeline import (
    OPTIMIZERS,
    AdamConfig,
    NAdamConfig,
    NesterovPPConfig,
    PipelineConfig,
)
from stalebench.engines.pipeline.stage import Stage, ops, split
from stalebench.errors import ConfigError
from stalebench.models.nets import decoder

CPU = torch.device("cpu")
SGD = NesterovPPConfig(name="nesterov_pp", lr=1.0, beta1=0.0, discount=False)  # w ← w − g


def linear_stage(index: int, pipe: PipelineConfig, weight: list[list[float]], device=CPU):
    layer = nn.Linear(len(weight[0]), len(weight), bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weight))
    return Stage(index, nn.Sequential(layer), pipe, SGD, device)


# --------------------------------------------------------- a stage's gradient and update


def test_a_flushed_step_applies_the_mean_of_its_microbatch_gradients():
    """GPipe, M = 2, the first of two stages, W = [1, 2]: out = W·x, ∂out/∂W = x, so the
    gradients are 1·[1, 0] and 3·[0, 1], their mean [0.5, 1.5], and w = [1, 2] − mean."""
    pipe = PipelineConfig(stages=2, schedule="gpipe", microbatches=2, clip_norm=0)
    stage = linear_stage(0, pipe, [[1.0, 2.0]])
    # a stage before the last forwards without targets and returns W·x
    assert stage.forward(0, torch.tensor([[1.0, 0.0]]), 0).tolist() == [[1.0]]
    assert stage.forward(1, torch.tensor([[0.0, 1.0]]), 0).tolist() == [[2.0]]
    grad_x, loss = stage.backward(0, torch.tensor([[1.0]]))
    assert grad_x.tolist() == [[1.0, 2.0]]  # ∂/∂x of g·W·x = g·W
    assert isinstance(loss, float) and math.isnan(loss)  # only the last stage has a loss
    stage.backward(1, torch.tensor([[3.0]]))
    applied = stage.apply()
    assert stage.w.tolist() == [0.5, 0.5]
    assert applied.version == 1 and applied.lag == 0
    assert applied.grad_norm == pytest.approx(math.sqrt(0.5**2 + 1.5**2))


def test_clipping_scales_the_gradient_down_to_the_norm_and_reports_the_norm_before():
    """g = [3, 4] (‖g‖ = 5) clipped to norm 1 is [0.6, 0.8]: w = [1, 2] − [0.6, 0.8]; the
    update reports ‖g‖ = 5 and its weight gap ‖w − w₀‖ = 1 (the forward ran at w₀)."""
    pipe = PipelineConfig(stages=2, clip_norm=1.0)
    stage = linear_stage(0, pipe, [[1.0, 2.0]])
    stage.forward(0, torch.tensor([[3.0, 4.0]]), 0)
    stage.backward(0, torch.tensor([[1.0]]))
    applied = stage.apply()
    torch.testing.assert_close(stage.w, torch.tensor([0.4, 1.2]))
    assert applied.grad_norm == pytest.approx(5.0)
    assert applied.weight_gap == pytest.approx(1.0)


def test_the_first_stage_takes_token_ids_and_returns_no_input_gradient():
    """An Embedding stage: token 1's row gets the gradient sent back, [1, −2]; ids have no
    gradient, so the stage returns None (and NaN for the loss) to send upstream."""
    pipe = PipelineConfig(stages=2, clip_norm=0)
    emb = nn.Embedding(3, 2)
    with torch.no_grad():
        emb.weight.copy_(torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]))
    stage = Stage(0, nn.Sequential(emb), pipe, SGD, CPU)
    assert stage.forward(0, torch.tensor([[1]]), 0).tolist() == [[[1.0, 1.0]]]
    grad_x, loss = stage.backward(0, torch.tensor([[[1.0, -2.0]]]))
    assert grad_x is None and math.isnan(loss)
    stage.apply()
    assert stage.w.tolist() == [0.0, 0.0, 0.0, 3.0, 2.0, 2.0]


def test_a_stage_keeps_its_weights_inputs_targets_and_gradients_on_its_device():
    """The meta device stands for an accelerator: inputs, targets and the gradient from
    downstream arrive on the CPU and the stage moves them to its device."""
    meta = torch.device("meta")
    pipe = PipelineConfig(stages=2, clip_norm=0)
    first = linear_stage(0, pipe, [[1.0, 2.0]], meta)
    last = linear_stage(1, pipe, [[1.0], [2.0], [3.0]], meta)
    assert [p.device for p in first.module.parameters()] == [meta]
    x, y = torch.tensor([[[1.0, 0.0]]]), torch.tensor([[2]])
    h = first.forward(0, x, 0, y)
    assert h.device == meta
    last.forward(0, torch.zeros(1, 1, 1), 0, y)
    kept_x, _, kept_y = last.inflight[0]  # what the last stage keeps for its backward
    assert (kept_x.device, kept_y.device) == (meta, meta)
    grad_x, _ = first.backward(0, torch.ones(1, 1, 1))  # a CPU gradient from downstream
    assert grad_x.device == meta


# ------------------------------------------------------------- the Adam-family optimizers


@pytest.mark.parametrize(
    "cfg, reference",
    [
        (
            AdamConfig(name="adamw", lr=0.01, weight_decay=0.1, beta2=0.99, eps=0.5),
            lambda p: torch.optim.AdamW([p], lr=0.05, betas=(0.5, 0.99), eps=0.5, weight_decay=0.1),
        ),
        (
            NAdamConfig(name="nadamw", lr=0.01, weight_decay=0.1, beta2=0.99, eps=0.5),
            lambda p: torch.optim.NAdam(
                [p],
                lr=0.05,
                betas=(0.5, 0.99),
                eps=0.5,
                weight_decay=0.1,
                momentum_decay=0.004,
                decoupled_weight_decay=True,
            ),
        ),
    ],
    ids=["adamw", "nadamw"],
)
def test_a_step_uses_its_own_lr_and_beta1_with_the_configs_beta2_eps_and_decay(cfg, reference):
    """The stage schedule's η = 0.05 and β₁ = 0.5 replace the config's 0.01 and 0.9 at every
    step; β₂ = 0.99 and ε = 0.5 (not torch's defaults) come from the config."""
    w = torch.tensor([1.0, -2.0, 0.5])
    p = torch.nn.Parameter(w.clone())
    ref = reference(p)
    opt = OPTIMIZERS.build(cfg, w)
    for g in (torch.tensor([0.3, -0.1, 2.0]), torch.tensor([-0.2, 0.4, 1.0])):
        opt.step(g, 0.05, 0.5)
        p.grad = g.clone()
        ref.step()
        torch.testing.assert_close(w, p.detach())


def test_1f1b_keeps_counting_microbatches_past_the_second():
    pipe = PipelineConfig(stages=2)  # the last stage: τ = 0, F(m), B(m), U(m) for m = 0, 1, 2…
    got = [op for op, _ in zip(ops(1, pipe), range(9), strict=False)]
    assert got == [("F", m) if i == 0 else ("B", m) if i == 1 else ("U", m) for m in range(3)
                   for i in range(3)]  # fmt: skip


@pytest.mark.parametrize(
    ("layers", "stages", "sizes"),
    [(6, 3, [1 + 2, 2, 2 + 1]), (4, 2, [1 + 2, 2 + 1]), (5, 3, [1 + 2, 2, 1 + 1])],
)
def test_split_gives_every_stage_its_share_of_blocks_when_they_divide_evenly(layers, stages, sizes):
    model = decoder(vocab=10, context=8, width=16, heads=2, layers=layers)
    assert [len(s) for s in split(model, stages)] == sizes


def test_split_refuses_more_stages_than_blocks_with_the_whole_message():
    model = decoder(vocab=10, context=8, width=16, heads=2, layers=2)
    with pytest.raises(ConfigError) as err:
        split(model, 3)
    assert str(err.value) == (
        "algorithm.pipeline.stages=3 exceeds model.layers=2: each stage needs at least one block"
    )


def test_adam_accepts_beta2_0_the_closed_end_of_its_range():
    assert AdamConfig(name="adamw", beta2=0.0).beta2 == 0.0


@pytest.mark.parametrize(
    "fields", [{"min_lr_ratio": 0.0}, {"min_lr_ratio": 1.0}, {"beta1": 0.0}], ids=str
)
def test_optimizer_ranges_accept_their_closed_ends(fields):
    cfg = AdamConfig(name="adamw", **fields)
    assert all(getattr(cfg, k) == v for k, v in fields.items())


def test_optimizer_beta1_1_is_refused_with_its_message():
    with pytest.raises(ConfigError) as err:
        AdamConfig(name="adamw", beta1=1.0)
    assert str(err.value) == "algorithm.optimizer.beta1 must be in [0, 1), got 1.0"
