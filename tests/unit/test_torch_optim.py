"""The update rules that are torch's optimizers (stalebench/algorithms/torch_optim.py): each
rule's steps are torch's optimizer stepped by hand on the same gradients, bit for bit, over
θ whole or over its per-tensor views; the optimizer's state carries over from step to step
and through a checkpoint; bad settings are refused by name; and P3 refuses them."""

from __future__ import annotations

import pytest
import torch

from stalebench import experiment
from stalebench.algorithms.base import BARRIERS, UPDATES, UpdateConfig
from stalebench.algorithms.torch_optim import (
    Adam,
    AdamConfig,
    AdamW,
    AdamWConfig,
    NAdam,
    NAdamConfig,
    TorchSGD,
    TorchSGDConfig,
)
from stalebench.algorithms.updates import SGD, SGDConfig
from stalebench.engines.ps import ParameterServer
from stalebench.errors import ConfigError
from tests.conftest import compose, fast_with
from tests.unit.test_server_state import Driver, through_disk

SHAPES = [(5, 3), (5,), (2, 5), (2,)]  # a small MLP's weights and biases: θ has 32 elements
D = sum(torch.Size(s).numel() for s in SHAPES)

# (rule, its config, torch.optim's class and arguments): none at torch's default
RULES = [
    (TorchSGD, TorchSGDConfig(name="torch_sgd", lr=0.05), "SGD", {"lr": 0.05}),
    (
        TorchSGD,
        TorchSGDConfig(name="torch_sgd", lr=0.05, momentum=0.8, dampening=0.2, weight_decay=0.01),
        "SGD",
        {"lr": 0.05, "momentum": 0.8, "dampening": 0.2, "weight_decay": 0.01},
    ),
    (
        TorchSGD,
        TorchSGDConfig(name="torch_sgd", lr=0.05, momentum=0.9, nesterov=True),
        "SGD",
        {"lr": 0.05, "momentum": 0.9, "nesterov": True},
    ),
    (
        Adam,
        AdamConfig(name="adam", lr=0.01, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.01),
        "Adam",
        {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.01},
    ),
    (
        Adam,
        AdamConfig(name="adam", lr=0.01, amsgrad=True),
        "Adam",
        {"lr": 0.01, "amsgrad": True},
    ),
    (
        AdamW,
        AdamWConfig(name="adamw", lr=0.01, beta1=0.85, beta2=0.95, weight_decay=0.1),
        "AdamW",
        {"lr": 0.01, "betas": (0.85, 0.95), "weight_decay": 0.1},
    ),
    (
        NAdam,
        NAdamConfig(name="nadam", lr=0.01, beta1=0.95, momentum_decay=0.01, weight_decay=0.01),
        "NAdam",
        {"lr": 0.01, "betas": (0.95, 0.999), "momentum_decay": 0.01, "weight_decay": 0.01},
    ),
    (
        NAdam,
        NAdamConfig(name="nadam", lr=0.01, weight_decay=0.05, decoupled_weight_decay=True),
        "NAdam",
        {"lr": 0.01, "weight_decay": 0.05, "decoupled_weight_decay": True},
    ),
]
IDS = [f"{cls.__name__}-{i}" for i, (cls, *_) in enumerate(RULES)]


def theta0() -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, D)


def gradients(steps: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(D, generator=g) for _ in range(steps)]


def by_hand(optimizer: str, kwargs: dict, shaped: bool) -> tuple[list[torch.Tensor], object]:
    """Separate tensors with θ₀'s values (the model's, or θ whole) and torch's optimizer."""
    shapes = SHAPES if shaped else [(D,)]
    sizes = [torch.Size(s).numel() for s in shapes]
    tensors = [t.clone().view(s) for t, s in zip(theta0().split(sizes), shapes, strict=True)]
    return tensors, getattr(torch.optim, optimizer)(tensors, **kwargs)


def stateful(optimizer: str, kwargs: dict) -> bool:
    """Does torch keep state for it (plain SGD keeps none)?"""
    return optimizer != "SGD" or bool(kwargs.get("momentum"))


def flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


@pytest.mark.parametrize("shaped", [True, False], ids=["per-tensor", "flat"])
@pytest.mark.parametrize("cls, cfg, optimizer, kwargs", RULES, ids=IDS)
def test_each_step_is_torch_s_optimizer_stepped_by_hand(cls, cfg, optimizer, kwargs, shaped):
    theta = theta0()
    rule = cls(cfg, theta, 4)
    if shaped:
        rule.set_shapes(SHAPES)
    tensors, opt = by_hand(optimizer, kwargs, shaped)
    for step, g in enumerate(gradients(6)):
        kept = g.clone()
        rule.step(theta, g, worker=step % 4 - 1, lag=step % 3)  # the lag changes nothing
        for t, part in zip(tensors, g.split([t.numel() for t in tensors]), strict=True):
            t.grad = part.view_as(t).clone()
        opt.step()
        assert torch.equal(theta, flat(tensors)), step
        assert torch.equal(g, kept)  # the engine's gradient is left as it was
    assert rule.updates == 6
    assert all(t.grad is None for t in rule.tensors)  # no buffer of the engine's kept


@pytest.mark.parametrize("cls, cfg, optimizer, kwargs", RULES, ids=IDS)
def test_the_optimizer_state_carries_over_from_step_to_step(cls, cfg, optimizer, kwargs):
    """Its state is torch's after the same steps (moments, step counts, momentum buffers),
    tensor by tensor; a rule rebuilt for each step (state lost) ends elsewhere."""
    theta, fresh = theta0(), theta0()
    rule = cls(cfg, theta, 1)
    rule.set_shapes(SHAPES)
    tensors, opt = by_hand(optimizer, kwargs, shaped=True)
    for g in gradients(4):
        rule.step(theta, g, 0, 0)
        forgetful = cls(cfg, fresh, 1)
        forgetful.set_shapes(SHAPES)
        forgetful.step(fresh, g, 0, 0)
        for t, part in zip(tensors, g.split([t.numel() for t in tensors]), strict=True):
            t.grad = part.view_as(t).clone()
        opt.step()
    ours, theirs = rule.opt.state, opt.state
    assert len(ours) == len(theirs) == (len(SHAPES) if stateful(optimizer, kwargs) else 0)
    for mine, reference in zip(rule.tensors, tensors, strict=True):
        assert ours[mine].keys() == theirs[reference].keys()
        for key, value in theirs[reference].items():
            assert torch.equal(torch.as_tensor(ours[mine][key]), torch.as_tensor(value)), key
    if stateful(optimizer, kwargs):
        assert not torch.equal(theta, fresh)


@pytest.mark.parametrize("cls, cfg, optimizer, kwargs", RULES, ids=IDS)
def test_a_checkpoint_mid_run_goes_on_bit_identically(cls, cfg, optimizer, kwargs):
    """θ and the rule saved together (as the server's state is) load with the optimizer's
    tensors still views of the loaded θ, and both go on as one that was never saved."""
    theta = theta0()
    rule = cls(cfg, theta, 1)
    rule.set_shapes(SHAPES)
    steps = gradients(6)
    for g in steps[:3]:
        rule.step(theta, g, 0, 0)
    saved = through_disk({"params": theta, "rule": rule})
    copy, copied = saved["rule"], saved["params"]
    assert copied.data_ptr() != theta.data_ptr()
    for g in steps[3:]:
        rule.step(theta, g, 0, 0)
        copy.step(copied, g, 0, 0)
    assert torch.equal(copied, theta)
    assert copy.updates == rule.updates == 6


@pytest.mark.parametrize(
    "barrier, update",
    [("asp", "adamw"), ("bsp", "nadam"), ("ssp", "torch_sgd"), ("gba", "adam")],
)
def test_a_server_rebuilt_from_its_state_goes_on_as_the_original(barrier, update):
    """The parameter server with a torch optimizer as its rule, through its checkpoint
    state (test_server_state's check, for the per-push, per-round and gathered updates)."""
    n = 3

    def build():
        cfg = compose(
            fast_with([f"algorithm/barrier={barrier}", f"algorithm/update={update}",
                       f"cluster.num_workers={n}", "algorithm.update.lr=0.01",
                       "budget.max_updates=9"])
        )  # fmt: skip
        params = torch.linspace(-1.0, 1.0, 7)
        rule = UPDATES.build(cfg.algorithm.update, params, n)
        rule.set_shapes([(3, 2), (1,)])
        events: list = []
        barrier_ = BARRIERS.build(cfg.algorithm.barrier, n, cfg.seed)
        emit = lambda kind, t, **fields: events.append((kind, t, fields))  # noqa: E731
        return ParameterServer(params, barrier_, rule, n, emit), events

    original, seen = build()
    driver = Driver(original)
    driver.take(original.start(0.0))
    for _ in range(17):
        driver.step()
    assert original.version > 0
    rebuilt, seen_rebuilt = build()
    rebuilt.resume(through_disk(original.state()))
    copy = Driver(rebuilt)
    copy.t = driver.t
    original.held, driver.ready = {}, {}
    driver.take(original.start(driver.t))
    copy.take(rebuilt.start(copy.t))
    seen.clear()
    for _ in range(30):
        driver.step()
        copy.step()
    assert torch.equal(rebuilt.params, original.params)
    assert seen_rebuilt == seen


def test_the_warm_up_rate_reaches_the_optimizer():
    """warmup_updates: each step runs at the rule's scheduled η (η/N up to η)."""
    theta = theta0()
    rule = AdamW(AdamWConfig(name="adamw", lr=0.04, warmup_updates=3), theta, 4)
    rule.set_shapes(SHAPES)
    tensors, opt = by_hand("AdamW", {"lr": 0.04}, shaped=True)
    rates = []
    for g in gradients(5):
        rates.append(rule.lr)
        opt.param_groups[0]["lr"] = rule.lr
        rule.step(theta, g, -1, 0)
        for t, part in zip(tensors, g.split([t.numel() for t in tensors]), strict=True):
            t.grad = part.view_as(t).clone()
        opt.step()
        assert torch.equal(theta, flat(tensors))
    assert rates == pytest.approx([0.01, 0.025, 0.04, 0.04, 0.04])  # linspace(η/N, η, W), then η


def test_the_defaults_are_torch_s():
    import inspect

    for cls, cfg in ((Adam, AdamConfig), (AdamW, AdamWConfig), (NAdam, NAdamConfig)):
        signature = inspect.signature(getattr(torch.optim, cls.optimizer)).parameters
        c = cfg(name="x")
        assert c.lr == signature["lr"].default
        assert (c.beta1, c.beta2) == signature["betas"].default
        assert c.eps == signature["eps"].default
        assert c.weight_decay == signature["weight_decay"].default
    nadam = inspect.signature(torch.optim.NAdam).parameters
    assert NAdamConfig(name="x").momentum_decay == nadam["momentum_decay"].default
    sgd = TorchSGDConfig(name="x")
    assert (sgd.momentum, sgd.dampening, sgd.nesterov) == (0.0, 0.0, False)


@pytest.mark.parametrize(
    "name, cls, config",
    [
        ("torch_sgd", TorchSGD, TorchSGDConfig),
        ("adam", Adam, AdamConfig),
        ("adamw", AdamW, AdamWConfig),
        ("nadam", NAdam, NAdamConfig),
    ],
)
def test_registered_under_the_documented_name_and_flags(name, cls, config):
    assert UPDATES.get(name) == (cls, config)
    assert issubclass(config, UpdateConfig)
    assert not cls.per_worker  # one optimizer at the server or on each replica: BSP may use it
    assert not cls.elementwise  # torch steps whole tensors: no P3 slices


def test_another_tensor_than_theta_is_refused():
    theta = theta0()
    rule = Adam(AdamConfig(name="adam"), theta, 1)
    with pytest.raises(ValueError, match="steps the θ it was built over"):
        rule.step(theta.clone(), torch.ones(D), 0, 0)
    assert rule.updates == 0


def test_shapes_must_cover_theta_and_come_before_the_first_step():
    theta = theta0()
    rule = Adam(AdamConfig(name="adam"), theta, 1)
    with pytest.raises(ValueError, match="shapes of 31 elements for a θ of 32"):
        rule.set_shapes([(5, 3), (5,), (2, 5), (1,)])
    rule.set_shapes(SHAPES)
    assert [tuple(t.shape) for t in rule.tensors] == SHAPES
    assert all(t.untyped_storage().data_ptr() == theta.data_ptr() for t in rule.tensors)
    rule.step(theta, torch.ones(D), 0, 0)
    with pytest.raises(RuntimeError, match="after 1 steps"):
        rule.set_shapes(SHAPES)


def test_a_rule_that_treats_theta_whole_ignores_the_shapes():
    theta = theta0()
    rule = SGD(SGDConfig(name="sgd", lr=0.5), theta, 1)
    rule.set_shapes(SHAPES)
    rule.step(theta, torch.ones(D), 0, 0)
    assert torch.equal(theta, theta0() - 0.5)


@pytest.mark.parametrize(
    "config, field, value",
    [
        (AdamConfig, "lr", 0.0),
        (AdamConfig, "beta1", 1.0),
        (AdamConfig, "beta2", -0.1),
        (AdamConfig, "eps", 0.0),
        (AdamWConfig, "beta2", 1.5),
        (AdamWConfig, "eps", -1e-8),
        (AdamWConfig, "weight_decay", -0.01),
        (NAdamConfig, "beta1", 1.0),
        (NAdamConfig, "eps", 0.0),
        (NAdamConfig, "lr", -1.0),
        (NAdamConfig, "momentum_decay", -0.004),
        (TorchSGDConfig, "lr", 0.0),
        (TorchSGDConfig, "momentum", 1.0),
        (TorchSGDConfig, "dampening", 1.5),
        (TorchSGDConfig, "nesterov", True),  # without momentum
    ],
)
def test_bad_config_names_the_key_and_the_value(config, field, value):
    with pytest.raises(ConfigError, match=rf"algorithm\.update\.{field}\b.*{value!s}"):
        config(name="x", **{field: value})


def test_nesterov_with_dampening_is_refused_as_torch_refuses_it():
    with pytest.raises(ConfigError, match=r"nesterov=True needs .* dampening=0\.1"):
        TorchSGDConfig(name="x", momentum=0.9, nesterov=True, dampening=0.1)


@pytest.mark.parametrize("update", ["torch_sgd", "adam", "adamw", "nadam"])
def test_p3_refuses_a_torch_optimizer_before_any_process(tmp_path, update):
    overrides = ["engine=allreduce", "algorithm=bsp", f"algorithm/update={update}",
                 "engine.bucket_mb=1", "engine.schedule=p3", "budget.max_updates=5"]  # fmt: skip
    cfg = compose(fast_with(overrides))
    cfg.run_dir = str(tmp_path / "run")
    with pytest.raises(ConfigError, match=rf"algorithm\.update={update} is not \(use one of"):
        experiment.prepare(cfg)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("engine", ["ps", "allreduce"])
@pytest.mark.parametrize("update", ["torch_sgd", "adam", "adamw", "nadam"])
def test_ps_and_allreduce_accept_them_per_round(tmp_path, engine, update):
    cfg = compose(fast_with([f"engine={engine}", "algorithm=bsp", f"algorithm/update={update}",
                             "budget.max_updates=5"]))  # fmt: skip
    cfg.run_dir = str(tmp_path / "run")
    experiment.prepare(cfg)
