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

This module is also the one place a plain optimizer is made and stepped, whatever role it
plays: `torch_optimizer` builds torch's class from a config's fields (an update rule here,
an inner optimizer of engine=local and gossip, a pipeline stage's), `torch_step` steps it
with a flat gradient, and `check_torch_fields` refuses the settings torch would refuse,
naming the config key. The staleness-aware rules and the outer rules stay their own.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from stalebench.algorithms.base import UPDATES, UpdateConfig, UpdateRule
from stalebench.errors import ConfigError

if TYPE_CHECKING:
    import torch


# the torch.optim classes a plain optimizer is, and the arguments each takes from a config
# (`betas` from its beta1 and beta2); an argument whose field a config lacks keeps torch's
# default
ARGUMENTS = {
    "SGD": ("lr", "momentum", "dampening", "weight_decay", "nesterov"),
    "Adam": ("lr", "betas", "eps", "weight_decay", "amsgrad"),
    "AdamW": ("lr", "betas", "eps", "weight_decay", "amsgrad"),
    "NAdam": ("lr", "betas", "eps", "weight_decay", "momentum_decay", "decoupled_weight_decay"),
}


def torch_optimizer(name: str, tensors: Sequence[torch.Tensor], cfg: Any, **fixed: Any):
    """torch.optim.<name> over `tensors`, its arguments the fields of `cfg` that name them
    (`ARGUMENTS`), then `fixed` (what the role sets whatever the config says)."""
    import torch

    args = {}
    for key in ARGUMENTS[name]:
        if key == "betas" and hasattr(cfg, "beta1"):
            args["betas"] = (cfg.beta1, cfg.beta2)
        elif hasattr(cfg, key):
            args[key] = getattr(cfg, key)
    return getattr(torch.optim, name)(tensors, **{**args, **fixed})


def check_torch_fields(cfg: Any, key: str) -> None:
    """Refuse, naming `key`.<field>, the values torch's optimizers refuse or misbehave with,
    of the fields `cfg` has: β₁, β₂ and momentum in [0, 1), eps > 0, momentum_decay >= 0."""
    for field in ("beta1", "beta2", "momentum"):
        value = getattr(cfg, field, 0.0)
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"{key}.{field} must be in [0, 1), got {value}")
    if not getattr(cfg, "eps", 1.0) > 0:
        raise ConfigError(f"{key}.eps must be > 0, got {cfg.eps}")
    if getattr(cfg, "momentum_decay", 0.0) < 0:
        raise ConfigError(f"{key}.momentum_decay must be >= 0, got {cfg.momentum_decay}")


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


# what torch.optim imports the first time an optimizer is built (torch._dynamo: about 2 s
# of CPU): a part that builds one says so (`imports`), and a real run's fork server imports
# it once, before the ranks are forked from it, instead of every rank at its start
IMPORTS = ("torch._dynamo",)


class KeepsOptimizer:
    """An object that keeps a torch optimizer `opt`, made by its `_build()`: pickled (into a
    checkpoint, or a spare's welcome) with the optimizer's `state_dict()` in its place —
    tensors and plain dicts, which a checkpoint's weights-only loader reads; the optimizer
    object holds a defaultdict it refuses — and rebuilt over the same tensors when loaded."""

    opt: Any
    imports: ClassVar[tuple[str, ...]] = IMPORTS

    def _build(self) -> Any:
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        return {**vars(self), "opt": self.opt.state_dict()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self.opt = self._build()
        self.opt.load_state_dict(state["opt"])


class TorchRule(KeepsOptimizer, UpdateRule):
    """A torch.optim optimizer over θ (or θ's per-tensor views), stepped with each gradient
    the engine applies; subclasses name the class (`optimizer`), its config the arguments."""

    optimizer: ClassVar[str] = ""  # the torch.optim class
    # torch steps whole tensors (Adam's step count, SGD's first momentum buffer are per
    # tensor): P3's slices cut tensors, so a round cannot be applied slice by slice
    elementwise = False

    def __init__(self, cfg: UpdateConfig, params: torch.Tensor, num_workers: int):
        super().__init__(cfg, params, num_workers)
        self.theta = params  # the flat θ the optimizer's tensors view
        self.tensors = [params]  # what it steps: θ itself until `set_shapes`
        self.opt = self._build()

    def _build(self):
        return torch_optimizer(self.optimizer, self.tensors, self.cfg)

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
        check_torch_fields(self, "algorithm.update")
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
        check_torch_fields(self, "algorithm.update")


@dataclasses.dataclass
class AdamConfig(MomentsConfig):
    amsgrad: bool = False  # divide by the running maximum of v̂ (AMSGrad)


@UPDATES.register("adam", AdamConfig)
class Adam(TorchRule):
    """torch.optim.Adam (Kingma & Ba 2015): weight_decay is L2, added to the gradient."""

    optimizer = "Adam"


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


@UPDATES.register("nadam", NAdamConfig)
class NAdam(TorchRule):
    """torch.optim.NAdam (Dozat 2016): Adam with Nesterov momentum and its μ_t warm-up."""

    optimizer = "NAdam"
