"""A test engine that brings its own kind of algorithm: `lone`, one process training alone
with a *step rule* (`algorithm/step=`: sgd, sign) from a registry of its own. It is this
module and its conf file, installed as a `stalebench.plugins` entry point; stalebench is
not edited for it (tests/integration/test_engine_own_kind.py)."""

from __future__ import annotations

import dataclasses

import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from stalebench.engines.base import ENGINES, NETWORK, Engine, EngineConfig
from stalebench.registry import ComponentConfig, Registry
from stalebench.runtime.faults import Faults
from stalebench.runtime.record import diverged, gradient, spent


@dataclasses.dataclass
class StepConfig(ComponentConfig):
    lr: float = 0.05  # the step size


# a registry of group algorithm/<slot> declares the part: `algorithm.step` in every schema
STEPS: Registry = Registry("step rule", "algorithm/step", "algorithm.step", StepConfig)


@STEPS.register("sgd", StepConfig)
class Sgd:
    """θ ← θ − lr·g."""

    def __init__(self, cfg: StepConfig):
        self.lr = cfg.lr

    def step(self, params: torch.Tensor, grad: torch.Tensor) -> None:
        params.add_(grad, alpha=-self.lr)


@STEPS.register("sign", StepConfig)
class Sign(Sgd):
    """signSGD: θ ← θ − lr·sign(g)."""

    def step(self, params: torch.Tensor, grad: torch.Tensor) -> None:
        params.add_(grad.sign(), alpha=-self.lr)


@ENGINES.register("lone", EngineConfig)
class Lone(Engine):
    """One process trains alone with a step rule of its own kind (algorithm/step=)."""

    slots = ("step",)
    ignores = NETWORK

    @property
    def num_workers(self) -> int:
        return 1

    def program(self, job, world):
        cfg, record, model = job.cfg, world.record, job.model()
        params = parameters_to_vector(model.parameters()).detach().clone()
        rule = STEPS.build(cfg.algorithm.step)
        net = job.model()
        net_params, batches = list(net.parameters()), job.batches(0)
        world.faults = Faults(job.profile, 0)

        def step():
            vector_to_parameters(params, net_params)
            return gradient(net, net_params, next(batches), torch.device("cpu"))

        yield from world.begin(lambda: None)
        version, status = 0, "completed"
        record.snapshots.maybe(0.0, 0, params)
        while status == "completed" and not spent(cfg.budget, version, world.now()):
            world.strike()
            (grad, loss), compute = yield from world.compute(step, job.profile.step_s(0))
            rule.step(params, grad)
            version += 1
            record.events.emit(
                "update", world.now(), worker=0, clock=version - 1, version=version, lag=0,
                loss=loss, compute_s=compute, wait_s=0.0, comm_s=0.0, clock_gap=0,
            )  # fmt: skip
            record.snapshots.maybe(world.now(), version, params)
            status = "diverged" if diverged(loss) else status
        return record.finish(model, params, version, world.now(), status, None, bytes_sent=0)
