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
from stalebench.runtime.driver import Ending, Role
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

    def role(self, job, world):
        return Alone(job, world)


class Alone(Role):
    """The one rank: θ, its step rule, and the run directory."""

    def __init__(self, job, world):
        self.job, self.world, self.model = job, world, job.model()
        self.params = parameters_to_vector(self.model.parameters()).detach().clone()
        self.rule = STEPS.build(job.cfg.algorithm.step)
        self.net = job.model()
        self.net_params, self.batches = list(self.net.parameters()), job.batches(0)

    def step(self):
        vector_to_parameters(self.params, self.net_params)
        return gradient(self.net, self.net_params, next(self.batches), torch.device("cpu"))

    def run(self):
        job, world, record, params = self.job, self.world, self.world.record, self.params
        world.play(0)
        version, status = 0, "completed"
        record.snapshots.maybe(0.0, 0, params)
        while status == "completed" and not spent(job.cfg.budget, version, world.now()):
            world.strike()
            (grad, loss), compute = yield from world.compute(self.step, job.profile.step_s(0))
            self.rule.step(params, grad)
            version += 1
            record.events.emit(
                "update", world.now(), worker=0, clock=version - 1, version=version, lag=0,
                loss=loss, compute_s=compute, wait_s=0.0, comm_s=0.0, clock_gap=0,
            )  # fmt: skip
            record.snapshots.maybe(world.now(), version, params)
            status = "diverged" if diverged(loss) else status
        return Ending(self.model, params, version, world.now(), status)
