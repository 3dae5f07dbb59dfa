"""Update rules that are torch's own optimizers: the data-parallel baseline DDP users run
(docs/algorithms.md §2.8). One adapter, `TorchRule`, holds a `torch.optim` optimizer over
θ and steps it with the gradient the engine hands it (a round's mean under BSP, each push
under ASP); the registered rules only name the class and map their config onto its
arguments, so the arithmetic is torch's, op for op:

    algorithm/update=torch_sgd   torch.optim.SGD (momentum: heavy ball; nesterov: Nesterov)
    algorithm/update=adam        torch.optim.Adam   (weight_decay: L2 in the gradient)
    algorithm/update=adamw       torch.optim.AdamW  (weight_decay: decoupled)
    algorithm/update=nadam       torch.optim.NAdam  (momentum_decay, decoupled_weight_decay)

Config fields and defaults are torch's (betas as beta1, beta2). The optimizer steps θ's
per-tensor views once the engine says which tensors θ is made of (`set_shapes`), so each
element takes the very code path it takes in DDP's replica; `warmup_updates` sets the
group's learning rate before each step.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from stalebench.algorithms.base import UPDATES, UpdateConfig, UpdateRule
from stalebench.algorithms.updates import check_momentum
from stalebench.errors import ConfigError

if TYPE_CHECKING:
    import torch


def _check_unit(key: str, value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ConfigError(f"algorithm.update.{key} must be in [0, 1), got {value}")


def _check_positive(key: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"algorithm.update.{key} must be > 0, got {value}")


def torch_step(opt: torch.optim.Optimizer, tensors: Sequence[torch.Tensor], grad, **group) -> None:
    """Step torch's optimizer `opt` over `tensors` (θ, or θ's views laid end to end) with the
    flat gradient `grad`, which it does not keep; `group`: settings of every param group for
    this step (a scheduled lr, betas). The one way a plain optimizer is stepped: an update
    rule (`TorchRule`), an inner optimizer (engine=local, gossip) and a pipeline stage's."""
    for g in opt.param_groups:
        g.update(group)
    lo = 0
    for t in tensors:
        t.grad = grad[lo : lo + t.numel()].view_as(t)
        lo += t.numel()
    try:
        opt.step()
    finally:
        for t in tensors:
            t.grad = None  # the caller's buffer is not kept past the step


class TorchRule(UpdateRule):
    """A torch.optim optimizer over θ (or θ's per-tensor views), stepped with each gradient
    the engine applies; subclasses name the class (`optimizer`) and its arguments."""

    optimizer: ClassVar[str] = ""  # the torch.optim class
    # torch steps whole tensors (Adam's step count, SGD's first momentum buffer are per
    # tensor): P3's slices cut tensors, so a round cannot be applied slice by slice
    elementwise = False

    def __init__(self, cfg: UpdateConfig, params: torch.Tensor, num_workers: int):
        super().__init__(cfg, params, num_workers)
        self.theta = params  # the flat θ the optimizer's tensors view
        self.tensors = [params]  # what it steps: θ itself until `set_shapes`
        self.opt = self._build()

    def arguments(self) -> dict[str, Any]:
        """The optimizer's keyword arguments beyond `lr` and `weight_decay` (from `self.cfg`)."""
        return {}

    def _build(self):
        import torch

        return getattr(torch.optim, self.optimizer)(
            self.tensors, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay, **self.arguments()
        )

    def set_shapes(self, shapes: Sequence[Sequence[int]]) -> None:
        if self.updates:
            raise RuntimeError(f"{type(self).__name__}: set_shapes after {self.updates} steps")
        sizes = [math.prod(s) for s in shapes]
        if sum(sizes) != self.theta.numel():
            raise ValueError(
                f"{type(self).__name__}: shapes of {sum(sizes)} elements for a θ of "
                f"{self.theta.numel()}"
            )
        starts = itertools.accumulate(sizes[:-1], initial=0)
        self.tensors = [
            self.theta[lo : lo + n].view(tuple(s))
            for lo, n, s in zip(starts, sizes, shapes, strict=True)
        ]
        self.opt = self._build()

    def apply(self, params: torch.Tensor, grad: torch.Tensor, worker: int, lag: int) -> None:
        if params.data_ptr() != self.theta.data_ptr() or params.numel() != self.theta.numel():
            raise ValueError(
                f"{type(self).__name__} steps the θ it was built over (a torch optimizer holds "
                "its tensors): got another tensor"
            )
        torch_step(self.opt, self.tensors, grad, lr=self.lr)


# ---------------------------------------------------------------------------- SGD


@dataclasses.dataclass
class TorchSGDConfig(UpdateConfig):
    momentum: float = 0.0  # γ of torch's buffer b ← γb + (1 − dampening)g; 0 = plain SGD
    dampening: float = 0.0
    nesterov: bool = False  # step g + γb instead of b (needs momentum > 0, dampening 0)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_momentum(self.momentum)
        if not 0.0 <= self.dampening <= 1.0:
            raise ConfigError(f"algorithm.update.dampening must be in [0, 1], got {self.dampening}")
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ConfigError(
                "algorithm.update.nesterov=True needs algorithm.update.momentum > 0 and "
                f"dampening = 0 (torch's rule), got momentum={self.momentum}, "
                f"dampening={self.dampening}"
            )


@UPDATES.register("torch_sgd", TorchSGDConfig)
class TorchSGD(TorchRule):
    """torch.optim.SGD: plain, heavy-ball (momentum) or Nesterov (nesterov) SGD, stepped by
    torch itself."""

    optimizer = "SGD"

    def arguments(self) -> dict[str, Any]:
        c = self.cfg
        return {"momentum": c.momentum, "dampening": c.dampening, "nesterov": c.nesterov}


# ---------------------------------------------------------------------------- Adam family


@dataclasses.dataclass
class MomentsConfig(UpdateConfig):
    """The Adam family's common fields: torch's betas and eps."""

    lr: float = 1e-3  # torch's default
    beta1: float = 0.9  # torch's betas[0]: decay of the first moment
    beta2: float = 0.999  # betas[1]: decay of the second moment
    eps: float = 1e-8  # added to √v̂ in the denominator

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_unit("beta1", self.beta1)
        _check_unit("beta2", self.beta2)
        _check_positive("eps", self.eps)


@dataclasses.dataclass
class AdamConfig(MomentsConfig):
    amsgrad: bool = False  # divide by the running maximum of v̂ (AMSGrad)


@UPDATES.register("adam", AdamConfig)
class Adam(TorchRule):
    """torch.optim.Adam (Kingma & Ba 2015): weight_decay is L2, added to the gradient."""

    optimizer = "Adam"

    def arguments(self) -> dict[str, Any]:
        c = self.cfg
        return {"betas": (c.beta1, c.beta2), "eps": c.eps, "amsgrad": c.amsgrad}


@dataclasses.dataclass
class AdamWConfig(AdamConfig):
    weight_decay: float = 1e-2  # decoupled: θ ← θ(1 − ηλ) before Adam's step (torch's default)


@UPDATES.register("adamw", AdamWConfig)
class AdamW(Adam):
    """torch.optim.AdamW (Loshchilov & Hutter 2019): Adam with decoupled weight decay."""

    optimizer = "AdamW"


@dataclasses.dataclass
class NAdamConfig(MomentsConfig):
    lr: float = 2e-3  # torch's default
    momentum_decay: float = 4e-3  # ψ of the warm-up μ_t = β₁(1 − ½·0.96^{tψ})
    # weight_decay decoupled (θ ← θ(1 − ηλ), "NAdamW") instead of L2 in the gradient
    decoupled_weight_decay: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.momentum_decay < 0:
            raise ConfigError(
                f"algorithm.update.momentum_decay must be >= 0, got {self.momentum_decay}"
            )


@UPDATES.register("nadam", NAdamConfig)
class NAdam(TorchRule):
    """torch.optim.NAdam (Dozat 2016): Adam with Nesterov momentum and its μ_t warm-up."""

    optimizer = "NAdam"

    def arguments(self) -> dict[str, Any]:
        c = self.cfg
        return {
            "betas": (c.beta1, c.beta2),
            "eps": c.eps,
            "momentum_decay": c.momentum_decay,
            "decoupled_weight_decay": c.decoupled_weight_decay,
        }
