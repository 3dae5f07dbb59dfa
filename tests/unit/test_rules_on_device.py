"""Every registered rule keeps its state and does its arithmetic on the device of the θ it
is given (issue 69): the update rules, the local engines' inner optimizers and outer rules,
and the pipeline's stage optimizers, each run on the meta device, where a hidden `.cpu()`,
`.item()`, `.numpy()` or a CPU tensor mixed in fails (a meta tensor has no values). A GPU
machine runs the same test on its GPU: STALEBENCH_TEST_DEVICE=cuda."""

from __future__ import annotations

import os

import pytest
import torch

from stalebench import plugins
from stalebench.algorithms.base import UPDATES
from stalebench.algorithms.gossip import GOSSIP
from stalebench.algorithms.local import INNER, OUTER
from stalebench.algorithms.pipeline import OPTIMIZERS
from stalebench.errors import ConfigError

plugins.load()
DEVICE = torch.device(os.environ.get("STALEBENCH_TEST_DEVICE", "meta"))
SHAPES = [(3, 4), (4,), (2, 2)]  # 20 parameters in three tensors
N = sum(torch.Size(s).numel() for s in SHAPES)
WORKERS = 3


def tensors(obj, seen=None) -> list[torch.Tensor]:
    """Every tensor an object holds (its attributes, containers, a torch optimizer's
    state), found by walking it."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, torch.optim.Optimizer):
        return tensors([obj.state, obj.param_groups], seen)
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors(v, seen)]
    if isinstance(obj, list | tuple | set):
        return [t for v in obj for t in tensors(v, seen)]
    if hasattr(obj, "__dict__") and type(obj).__module__.startswith("stalebench"):
        return tensors(vars(obj), seen)
    return []


def on_device(obj) -> None:
    """Every tensor of `obj` on DEVICE, but 0-dimensional ones: torch's optimizers keep
    their step counts on the CPU on purpose (a scalar mixes with any device's tensors)."""
    elsewhere = [tuple(t.shape) for t in tensors(obj) if t.dim() and t.device != DEVICE]
    assert not elsewhere, f"tensors off {DEVICE}: {elsewhere}"


def vec(k: int = 0) -> torch.Tensor:
    """A flat vector of N on DEVICE (on the meta device, no values)."""
    return torch.full((N,), 0.1 * (k + 1), device=DEVICE)


@pytest.mark.parametrize("name", UPDATES.names())
def test_an_update_rule_runs_on_the_device_of_its_theta(name):
    cls, cfg_cls = UPDATES.get(name)
    theta = vec()
    rule = cls(cfg_cls(name=name), theta, WORKERS)
    rule.set_shapes(SHAPES)
    for k in range(4):  # every worker, at lags 0 to 3
        worker = k % WORKERS if cls.per_worker else (k % WORKERS if k % 2 else -1)
        assert rule.params_for(theta, max(worker, 0)).device == DEVICE
        message = cls.worker_message(rule.cfg, vec(k), {})
        rule.step(theta, message, worker, lag=k)
    assert theta.device == DEVICE
    on_device(rule)


@pytest.mark.parametrize("name", INNER.names())
def test_an_inner_optimizer_runs_on_the_device_of_its_replica(name):
    cls, cfg_cls = INNER.get(name)
    x = vec()
    opt = cls(cfg_cls(name=name), x)
    for k in range(3):
        opt.new_round()
        opt.step(vec(k))
    on_device(opt)


@pytest.mark.parametrize("name", OUTER.names())
def test_an_outer_rule_runs_on_the_device_of_its_theta(name):
    cls, cfg_cls = OUTER.get(name)
    theta, x = vec(), vec(1)
    rule = cls(cfg_cls(name=name), theta, WORKERS)
    for k in range(3):
        if cls.exchange == "mean":
            rule.step(theta, vec(k))
            rule.replica(x, vec(k + 1), theta)
        else:  # the leaders' replicas, one a group (LSGD), the losses on the host
            leaders, best = rule.leaders([0.5, 0.25, 1.0][:WORKERS])
            rule.pull(x, k % WORKERS, leaders, best, torch.stack([vec(g) for g in leaders]))
    assert theta.device == x.device == DEVICE
    on_device(rule)


@pytest.mark.parametrize("name", OPTIMIZERS.names())
def test_a_stage_optimizer_runs_on_the_device_of_its_weights(name):
    cls, cfg_cls = OPTIMIZERS.get(name)
    w = vec()
    opt = cls(cfg_cls(name=name), w)
    for k in range(3):
        assert opt.point().device == DEVICE
        opt.step(vec(k), lr=0.1, beta1=0.9)
    on_device(opt)


@pytest.mark.parametrize("name", GOSSIP.names())
def test_a_mixing_rule_runs_on_the_device_of_its_node(name):
    cls, cfg_cls = GOSSIP.get(name)
    try:
        rule = cls(cfg_cls(name=name), 4)
    except ConfigError:  # D-PSGD's W needs an undirected graph
        rule = cls(cfg_cls(name=name, topology="ring"), 4)
    x, w = vec(), torch.ones(1, device=DEVICE)
    for k in range(3):
        message = rule.send(x, w, node=1, k=k)
        assert message.device == DEVICE
        rule.receive(x, w, message)
        assert rule.debias(x, w).device == DEVICE
    on_device(rule)
