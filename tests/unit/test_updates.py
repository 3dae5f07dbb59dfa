"""Server-side update rules match torch.optim.SGD's definition step for step."""

import pytest
import torch

from stalebench.algorithms.updates import SGD, Momentum, MomentumConfig, SGDConfig
from stalebench.errors import ConfigError


@pytest.mark.parametrize(
    "rule_cfg, torch_kw",
    [
        (SGDConfig(name="sgd", lr=0.1), dict(lr=0.1)),
        (SGDConfig(name="sgd", lr=0.05, weight_decay=0.01), dict(lr=0.05, weight_decay=0.01)),
        (MomentumConfig(name="momentum", lr=0.1, momentum=0.9), dict(lr=0.1, momentum=0.9)),
        (
            MomentumConfig(name="momentum", lr=0.1, momentum=0.8, nesterov=True, weight_decay=1e-3),
            dict(lr=0.1, momentum=0.8, nesterov=True, weight_decay=1e-3),
        ),
    ],
)
def test_rule_equals_torch_sgd(rule_cfg, torch_kw):
    torch.manual_seed(0)
    theta = torch.randn(50)
    reference = theta.clone().requires_grad_(True)
    opt = torch.optim.SGD([reference], **torch_kw)
    rule = (Momentum if isinstance(rule_cfg, MomentumConfig) else SGD)(rule_cfg, theta, 4)
    for step in range(10):
        g = torch.randn(50)
        rule.apply(theta, g, worker=step % 4, lag=step % 3)
        reference.grad = g.clone()
        opt.step()
        torch.testing.assert_close(theta, reference.detach(), rtol=0, atol=1e-6)


def test_hand_computed_nesterov_step():
    """v ← γv + g; θ ← θ − η(g + γv), starting from v = 0."""
    theta = torch.tensor([1.0, -2.0])
    rule = Momentum(MomentumConfig(name="momentum", lr=0.5, momentum=0.5, nesterov=True), theta, 1)
    rule.apply(theta, torch.tensor([1.0, 1.0]), 0, 0)  # v = 1; step = 1 + 0.5
    torch.testing.assert_close(theta, torch.tensor([0.25, -2.75]))
    rule.apply(theta, torch.tensor([0.0, 2.0]), 0, 0)  # v = (0.5, 2.5); step = (0.25, 3.25)
    torch.testing.assert_close(theta, torch.tensor([0.125, -4.375]))


def test_rules_send_theta_itself():
    theta = torch.zeros(3)
    assert SGD(SGDConfig(name="sgd"), theta, 2).params_for(theta, 1) is theta


def test_bad_update_config_names_the_key():
    with pytest.raises(ConfigError, match=r"algorithm\.update\.lr.*0"):
        SGDConfig(name="sgd", lr=0.0)
    with pytest.raises(ConfigError, match=r"algorithm\.update\.momentum.*1\.5"):
        MomentumConfig(name="momentum", momentum=1.5)
    with pytest.raises(ConfigError, match=r"algorithm\.update\.weight_decay"):
        SGDConfig(name="sgd", weight_decay=-1)
