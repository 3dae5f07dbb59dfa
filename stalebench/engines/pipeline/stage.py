"""The pipeline engine's pure parts: a stage's numerics and each stage's op order.

A `Stage` holds one contiguous slice of the model, its optimizer, and the points (weight
versions) its in-flight microbatches were forwarded with. Both runtimes drive stages
through the same three calls, `forward`, `backward`, `apply`, in the order of its
schedule (`ops`), from one program (`program.py`): the simulator and the processes compute
the same numbers by construction (docs/algorithms.md §10.7).

A backward recomputes the stage's forward from its stored input (PipeDream's
`--recompute`): with weight stashing at the point the forward used, without it at the
stage's current point. The last stage's forward only stores its input; its backward
computes the loss.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import torch
from torch import nn

from stalebench.algorithms.pipeline import (
    OPTIMIZERS,
    OptimizerConfig,
    PipelineConfig,
    stage_hyper,
)
from stalebench.errors import ConfigError
from stalebench.models.nets import Stackable, flatten_parameters


def split(model: Stackable, stages: int) -> list[nn.Sequential]:
    """Cut [Embed, Block × L, Head] into `stages` contiguous slices, blocks spread as evenly
    as possible (earlier stages take the remainder); the first holds the embeddings, the
    last the head."""
    parts = list(model.children())
    blocks = parts[1:-1]
    if stages > len(blocks):
        raise ConfigError(
            f"algorithm.pipeline.stages={stages} exceeds model.layers={len(blocks)}: each "
            "stage needs at least one block"
        )
    sizes = [len(blocks) // stages + (k < len(blocks) % stages) for k in range(stages)]
    out, start = [], 0
    for k, size in enumerate(sizes):
        mods = blocks[start : start + size]
        start += size
        out.append(
            nn.Sequential(
                *([parts[0]] if k == 0 else []), *mods, *([parts[-1]] if k == stages - 1 else [])
            )
        )
    return out


@dataclasses.dataclass
class Applied:
    """What one update of a stage did, for its `update` event."""

    version: int  # the stage's version after the update
    lag: int  # updates between the forward's weights and the weights updated
    weight_gap: float  # ‖w after the update − the point the microbatch's forward used‖
    grad_norm: float  # before clipping


class Stage:
    def __init__(
        self,
        index: int,
        module: nn.Sequential,
        pipe: PipelineConfig,
        opt: OptimizerConfig,
        device: torch.device,
        numerics: bool = True,
    ):
        self.index, self.pipe, self.opt_cfg, self.device = index, pipe, opt, device
        self.numerics = numerics  # false: a cost-only run's ops keep the versions only
        self.last = index == pipe.stages - 1
        self.module = module.to(device)
        self.flat = flatten_parameters(self.module)  # what the module computes with
        self.params = list(self.module.parameters())
        self.w = self.flat.detach().clone()  # the stage's weights, updated by the optimizer
        self.optimizer = OPTIMIZERS.build(opt, self.w)
        self.tau = pipe.delay(index)
        self.version = 0
        self.points = {0: self.optimizer.point()}  # version → where its forwards ran
        self.inflight: dict[int, tuple[torch.Tensor, int, torch.Tensor | None]] = {}
        self.grad_version = 0  # the version the kept gradient was taken at
        self.accumulated: torch.Tensor | None = None  # flushed schedules: Σ gradients
        self.accumulated_n = 0

    def forward(self, m: int, x: torch.Tensor, version: int, y: torch.Tensor | None = None):
        """Forward microbatch m at the point of `version`; returns the output to send on
        (None on the last stage, which keeps x and the targets y for its backward)."""
        x = x.to(self.device)
        self.inflight[m] = (x, version, None if y is None else y.to(self.device))
        if self.last or not self.numerics:
            return None
        self.flat.copy_(self.points[version])
        with torch.no_grad():
            return self.module(x)

    def backward(self, m: int, grad_out: torch.Tensor | None) -> tuple[torch.Tensor | None, float]:
        """Backward microbatch m: the gradient w.r.t. the stage's input (None on the first
        stage) and, on the last stage, the loss. The stage's gradient is kept for `apply`."""
        x, version, y = self.inflight.pop(m)
        self.grad_version = version
        if not self.numerics:
            self.accumulated_n += 1
            return None, math.nan
        stashed = self.pipe.weight_stashing or self.pipe.flush
        self.flat.copy_(self.points[version] if stashed else self.optimizer.point())
        if x.is_floating_point():  # hidden states, not the first stage's token ids
            x = x.detach().requires_grad_(True)
        out = self.module(x)
        loss = float("nan")
        inputs = self.params + ([x] if x.requires_grad else [])
        if self.last:
            objective = nn.functional.cross_entropy(out.flatten(0, 1), y.flatten())
            grads = torch.autograd.grad(objective, inputs)
            loss = objective.item()
        else:
            grads = torch.autograd.grad(out, inputs, grad_out.to(self.device))
        g = torch.cat([t.reshape(-1) for t in grads[: len(self.params)]])
        if self.accumulated is None:
            self.accumulated, self.accumulated_n = g, 1
        else:
            self.accumulated += g
            self.accumulated_n += 1
        return (grads[-1] if x.requires_grad else None), loss

    def apply(self) -> Applied:
        """The optimizer step with the gradient kept since the last one (the mean, when a
        flushed schedule accumulated several microbatches)."""
        version, lag = self.grad_version, self.version - self.grad_version
        if not self.numerics:
            self.accumulated_n, self.version = 0, self.version + 1
            return Applied(self.version, lag, math.nan, math.nan)
        g = self.accumulated / self.accumulated_n
        self.accumulated, self.accumulated_n = None, 0
        grad_norm = float(g.norm())
        if self.pipe.clip_norm and grad_norm > self.pipe.clip_norm:
            g = g * (self.pipe.clip_norm / grad_norm)
        lr, beta1 = stage_hyper(self.pipe, self.opt_cfg, self.index, self.version)
        self.optimizer.step(g, lr, beta1)
        gap = float((self.w - self.points[version]).norm())
        self.version += 1
        self.points[self.version] = self.optimizer.point()
        for old in [v for v in self.points if v < self.version - self.tau]:
            del self.points[old]  # no forward in flight can use it any more
        return Applied(self.version, lag, gap, grad_norm)

    def forward_version(self, m: int) -> int:
        """The version stage k holds when it forwards microbatch m under its schedule:
        max(m − τ_k, 0) for 1F1B; the step's version for a flushed schedule."""
        return m // self.pipe.per_step if self.pipe.flush else max(m - self.tau, 0)


def ops(stage: int, pipe: PipelineConfig) -> Iterator[tuple[str, int]]:
    """A stage's endless op order: ("F", m), ("B", m) and, for a flushed schedule, ("U", s)
    after the backwards of step s. 1F1B: τ_k warm-up forwards, then F(m+τ_k), B(m), each
    backward followed by its update. GPipe: per step M forwards, M backwards, one update."""
    if pipe.flush:
        M, s = pipe.microbatches, 0
        while True:
            yield from (("F", s * M + j) for j in range(M))
            yield from (("B", s * M + j) for j in range(M))
            yield ("U", s)
            s += 1
    tau = pipe.delay(stage)
    yield from (("F", m) for m in range(tau))
    m = 0
    while True:
        yield ("F", m + tau)
        yield ("B", m)
        yield ("U", m)
        m += 1
