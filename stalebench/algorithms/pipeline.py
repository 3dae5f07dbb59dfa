"""Pipeline-parallel algorithms (docs/algorithms.md §10): the schedule a pipeline runs and the
optimizer each stage applies to its own weights.

A stage optimizer owns one stage's flat weight vector and takes one gradient per update.
`point()` is where the stage's next forward is evaluated: the weights themselves for the
Adam family, the look-ahead w_t + d_t for Nesterov-PP. The pipeline engine stashes those
points, so a stale gradient is always taken at the point the optimizer asked for.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, ClassVar

from stalebench.algorithms.torch_optim import (
    IMPORTS,
    check_torch_fields,
    torch_optimizer,
    torch_step,
)
from stalebench.errors import ConfigError
from stalebench.registry import ComponentConfig, Part, Registry

if TYPE_CHECKING:
    import torch

SCHEDULES = ("async_1f1b", "gpipe")


# the schedule: a part with no registry, whose config is its class (`registry.part_class`)
@dataclasses.dataclass
class PipelineConfig(Part):
    stages: int = 4  # K: one process per stage; the model's blocks are split over them
    # async_1f1b: PipeDream's schedule without flush, stage k updates after every backward
    # with delay τ_k = K−1−k; gpipe: all microbatches forward, all backward, one update
    schedule: str = "async_1f1b"
    # async_1f1b: backpropagate through the weights the forward used (PipeDream, "ours");
    # false: through the stage's current weights ("Ours-No-WS", PipeMare)
    weight_stashing: bool = True
    microbatches: int = 4  # gpipe: a minibatch of dataset.batch_size is split into this many
    clip_norm: float = 10.0  # each stage clips its gradient to this L2 norm (0 = off)
    # §10.4, for no-stashing runs: η_k = η / τ_k^p at step s (0-based), p = 1 − (s + 1)/T
    # falling to 0 at step T − 1 of these T steps, on stages with τ_k > 0 (PipeMare's LR
    # correction, as the official code computes it); 0 = off
    lr_correction_steps: int = 0
    # §10.4: γ_k = γ₀ + τ_k·(0.99 − γ₀)/K, more momentum where the delay is larger
    adaptive_momentum: bool = False

    def __post_init__(self) -> None:
        key = "algorithm.pipeline"
        if self.stages < 1:
            raise ConfigError(f"{key}.stages must be >= 1, got {self.stages}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(
                f"{key}.schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}"
            )
        if self.microbatches < 1:
            raise ConfigError(f"{key}.microbatches must be >= 1, got {self.microbatches}")
        if self.clip_norm < 0:
            raise ConfigError(f"{key}.clip_norm must be >= 0, got {self.clip_norm}")
        if self.lr_correction_steps < 0:
            raise ConfigError(
                f"{key}.lr_correction_steps must be >= 0, got {self.lr_correction_steps}"
            )

    @classmethod
    def check(cls, cfg: PipelineConfig, num_workers: int, run: Any = None) -> None:
        """A flushed step splits the minibatch into its microbatches."""
        batch = run.dataset.batch_size if run is not None else 0
        if cfg.flush and batch % cfg.microbatches:
            raise ConfigError(
                f"dataset.batch_size={batch} must be a multiple of "
                f"algorithm.pipeline.microbatches={cfg.microbatches}"
            )

    @property
    def label(self) -> str:
        """A run's label names the schedule (`<schedule>+<optimizer>`)."""
        return self.schedule

    @property
    def flush(self) -> bool:
        """A synchronous schedule: every step ends with all stages updated together."""
        return self.schedule == "gpipe"

    @property
    def per_step(self) -> int:
        """Microbatches a stage applies in one update: all M of a flushed step, else one."""
        return self.microbatches if self.flush else 1

    def delay(self, stage: int) -> int:
        """τ_k: updates a stage applies between a microbatch's forward and its backward."""
        return 0 if self.flush else self.stages - 1 - stage


@dataclasses.dataclass
class OptimizerConfig(ComponentConfig):
    # η (the peak, when a schedule is set); the Adam family's default suits the small
    # char-level decoder (1e-3 and 3e-3 tried: 3e-3 better for AdamW, NAdamW and GPipe)
    lr: float = 3e-3
    beta1: float = 0.9  # β₁ (Adam family) or γ (Nesterov-PP)
    weight_decay: float = 0.0  # λ: decoupled (AdamW-style) for the Adam family
    # §10.4's schedule: η rises linearly over warmup_steps, then falls along a cosine to
    # min_lr_ratio·η over cosine_steps and stays there; 0 = no warm-up / no decay
    warmup_steps: int = 0
    cosine_steps: int = 0
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ConfigError(f"algorithm.optimizer.lr must be > 0, got {self.lr}")
        for key in ("warmup_steps", "cosine_steps"):
            if getattr(self, key) < 0:
                raise ConfigError(
                    f"algorithm.optimizer.{key} must be >= 0, got {getattr(self, key)}"
                )
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(
                f"algorithm.optimizer.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}"
            )
        if not 0.0 <= self.beta1 < 1.0:
            raise ConfigError(f"algorithm.optimizer.beta1 must be in [0, 1), got {self.beta1}")
        if self.weight_decay < 0:
            raise ConfigError(
                f"algorithm.optimizer.weight_decay must be >= 0, got {self.weight_decay}"
            )


class StageOptimizer(Part):
    """One stage's optimizer over its flat weights `w` (updated in place)."""

    def __init__(self, cfg: OptimizerConfig, w: torch.Tensor):
        self.cfg, self.w = cfg, w

    def point(self) -> torch.Tensor:
        """Where the next forward evaluates the stage (a tensor the caller may keep)."""
        return self.w.clone()

    def step(self, grad: torch.Tensor, lr: float, beta1: float) -> None:
        raise NotImplementedError


OPTIMIZERS: Registry[StageOptimizer] = Registry(
    "pipeline optimizer", "algorithm/optimizer", "algorithm.optimizer", OptimizerConfig
)


@dataclasses.dataclass
class AdamConfig(OptimizerConfig):
    weight_decay: float = 0.01  # §10.4, decoupled
    beta2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self) -> None:
        super().__post_init__()
        check_torch_fields(self, "algorithm.optimizer")


class _Torch(StageOptimizer):
    """A torch.optim optimizer on the flat weights, fed one gradient per step; a subclass
    names the class (`torch_name`) and what it sets whatever the config says (`fixed`), the
    config the rest (`torch_optimizer`)."""

    torch_name = ""
    fixed: ClassVar[dict] = {}
    imports: ClassVar[tuple[str, ...]] = IMPORTS

    def __init__(self, cfg: AdamConfig, w: torch.Tensor):
        super().__init__(cfg, w)
        import torch

        self.param = torch.nn.Parameter(w, requires_grad=False)  # shares w's storage
        self.opt = torch_optimizer(self.torch_name, [self.param], cfg, **self.fixed)

    def step(self, grad: torch.Tensor, lr: float, beta1: float) -> None:
        torch_step(self.opt, [self.param], grad, lr=lr, betas=(beta1, self.cfg.beta2))


@OPTIMIZERS.register("adamw", AdamConfig)
class AdamW(_Torch):
    """torch.optim.AdamW: the PipeDream and GPipe baselines (β₁ = 0.9)."""

    torch_name = "AdamW"


@dataclasses.dataclass
class NAdamConfig(AdamConfig):
    beta1: float = 0.99
    # ψ of NAdam's momentum schedule μ_t = β₁(1 − ½·0.96^{tψ}): the official code's 0.004
    # (over its 50,000 steps μ climbs from 0.5·β₁ to β₁); a run of T steps keeps the same μ
    # at the same fraction of the run with ψ = 0.004 · 50,000 / T (§10.6)
    momentum_decay: float = 0.004


@OPTIMIZERS.register("nadamw", NAdamConfig)
class NAdamW(_Torch):
    """torch.optim.NAdam with decoupled weight decay, β₁ = 0.99: what the official
    Nesterov-PP code runs (§10.2; PluralisResearch/AsyncPP optim/nadamw.py wraps
    torch.optim.NAdam, momentum_decay 0.004 by default and in its run script). NAdam's
    momentum μ_t follows the schedule set by `momentum_decay`, not β₁ itself."""

    torch_name = "NAdam"
    fixed: ClassVar[dict] = {"decoupled_weight_decay": True}


@dataclasses.dataclass
class NesterovPPConfig(OptimizerConfig):
    # weight_decay here is L2 (added to the gradient), not decoupled: a decoupled
    # w(1 − η·λ) with this optimizer's η of ~10 would erase the weights. Off by default:
    # the momentum multiplies it by 1/(1 − γ), so λ = 0.01 already shrinks w by ηλ = 10 %
    # a step and stops learning (measured: validation loss stuck at 3.2).
    # η of a plain (non-adaptive) step: 0.3, 1, 3, 10 and 30 tried on the char-level decoder
    # with warm-up; 10 was the best, 30 blew up
    lr: float = 10.0
    beta1: float = 0.99  # γ, constant (the paper's practical choice)
    # multiply the stale gradient by (1 − γ) (the method); false is the paper's ablation
    discount: bool = True


@OPTIMIZERS.register("nesterov_pp", NesterovPPConfig)
class NesterovPP(StageOptimizer):
    """The paper's equation (§10.2), in weight space:
        d_t = γ (w_t − w_{t−1});   w_{t+1} = w_t + d_t − η (1 − γ) g,
    with g the gradient the pipeline delivers, taken at a (stale) look-ahead point
    w̄ + d̄ that `point()` handed out."""

    def __init__(self, cfg: NesterovPPConfig, w: torch.Tensor):
        super().__init__(cfg, w)
        self.prev = w.clone()  # w_{t−1}; d_0 = 0
        self.gamma = cfg.beta1  # the γ of the last step: d_t uses it

    def point(self) -> torch.Tensor:
        return self.w + self.gamma * (self.w - self.prev)

    def step(self, grad: torch.Tensor, lr: float, beta1: float) -> None:
        d = beta1 * (self.w - self.prev)
        scale = lr * (1.0 - beta1) if self.cfg.discount else lr
        if self.cfg.weight_decay:  # L2, through the gradient: a plain step's η is large
            grad = grad + self.cfg.weight_decay * self.w
        self.prev.copy_(self.w)
        self.w.add_(d).add_(grad, alpha=-scale)
        self.gamma = beta1


def scheduled_lr(opt: OptimizerConfig, step: int) -> float:
    """η at a step (0-based) of the linear warm-up and cosine decay."""
    if step < opt.warmup_steps:
        return opt.lr * (step + 1) / opt.warmup_steps
    if not opt.cosine_steps:
        return opt.lr
    progress = min((step - opt.warmup_steps) / opt.cosine_steps, 1.0)
    floor = opt.min_lr_ratio
    return opt.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def stage_hyper(
    pipe: PipelineConfig, opt: OptimizerConfig, stage: int, step: int
) -> tuple[float, float]:
    """(η_k, β₁_k) of a stage at a step (0-based): the learning-rate schedule, then the
    §10.4 stage-dependent options. The correction's exponent counts the step from 1, as the
    warm-up does, as AsyncPP's `adjust_learning_rate` does for both."""
    lr, beta1 = scheduled_lr(opt, step), opt.beta1
    tau = pipe.delay(stage)
    if pipe.adaptive_momentum:
        beta1 = beta1 + tau * (0.99 - beta1) / pipe.stages
    if pipe.lr_correction_steps and tau > 0:
        p = max(0.0, 1.0 - (step + 1) / pipe.lr_correction_steps)
        lr = lr / tau**p
    return lr, beta1
