"""The example plugin's update rule (examples/plugin, signSGD) on hand-made tensors: it
follows the contract every built-in rule follows, including the learning-rate warm-up."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

from stalebench.algorithms import UPDATES
from stalebench.algorithms.updates import SGD, SGDConfig

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "examples" / "plugin"


@pytest.fixture
def signsgd():
    """The plugin module, imported from the source tree; the registry is restored after."""
    entries = dict(UPDATES._entries)
    sys.path.insert(0, str(PLUGIN_DIR))
    try:
        module = importlib.import_module("stalebench_signsgd")
        yield module
    finally:
        sys.path.remove(str(PLUGIN_DIR))
        sys.modules.pop("stalebench_signsgd", None)
        UPDATES._entries.clear()
        UPDATES._entries.update(entries)


def test_first_step_is_lr_over_n_during_warm_up(signsgd):
    """With warmup_updates > 0 the first step is η/N, as for the built-in rules."""
    theta = torch.zeros(3)
    cfg = signsgd.SignSGDConfig(name="signsgd", lr=0.4, warmup_updates=4)
    rule = signsgd.SignSGD(cfg, theta, 4)
    rule.step(theta, torch.tensor([2.0, -0.5, 3.0]), worker=0, lag=0)
    torch.testing.assert_close(theta, torch.tensor([-0.1, 0.1, -0.1]))


def test_steps_follow_the_same_schedule_as_sgd(signsgd):
    """On gradients of ±1, sign(g) = g: signSGD and the built-in SGD must take the same
    steps, through the warm-up (η/N → η) and after it."""
    torch.manual_seed(0)
    theta = torch.randn(20)
    reference = theta.clone()
    kw = dict(lr=0.4, weight_decay=0.0, warmup_updates=3)
    rule = signsgd.SignSGD(signsgd.SignSGDConfig(name="signsgd", **kw), theta, 4)
    sgd = SGD(SGDConfig(name="sgd", **kw), reference, 4)
    for step in range(6):
        g = torch.randint(0, 2, (20,)).float() * 2 - 1
        rule.step(theta, g, worker=step % 4, lag=1)
        sgd.step(reference, g, worker=step % 4, lag=1)
        torch.testing.assert_close(theta, reference, rtol=0, atol=1e-6)


def test_registered_under_its_name(signsgd):
    assert UPDATES.get("signsgd") == (signsgd.SignSGD, signsgd.SignSGDConfig)
