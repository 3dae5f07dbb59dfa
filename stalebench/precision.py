"""The arithmetic of a run's real compute — the workers' forward and backward passes in
both runtimes (one at a time, or the simulator's batched gradients) — set once per process
from the config, as torchtitan sets its mixed precision:

- `precision=fp32` (the default): float32 throughout, TF32 off for CUDA's matmuls and
  cuDNN's convolutions (cuDNN allows TF32 unless told otherwise: stated here);
- `tf32`: float32 tensors, CUDA's matmuls and convolutions in TF32;
- `bf16`: the forward pass under `torch.autocast` to bfloat16 (θ, its gradient and the
  update stay float32, as with DDP and autocast);
- `fp16`: the forward pass under autocast to float16, the loss scaled as
  `torch.amp.GradScaler` scales it (`LossScale`: each worker's own, by GradScaler's own
  ops). Where GradScaler skips an optimizer step whose gradient overflowed, a worker
  computes that gradient again at the halved scale (same minibatch, same BatchNorm
  statistics): every algorithm's step is a gradient of its minibatch, as in float32.

`deterministic=true` turns on torch's deterministic algorithms (cuDNN's too, its
benchmark off; CUBLAS_WORKSPACE_CONFIG set for cuBLAS). Both are recorded in summary.json
(`arithmetic`). The simulator's modelled step time has its own `cluster.precision`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from stalebench.registry import stored

if TYPE_CHECKING:
    import torch

_autocast: str | None = None  # the dtype's name under autocast (bf16, fp16), once `configure`d
AUTOCAST = {"bf16": "bfloat16", "fp16": "float16"}


def configure(precision: str, deterministic: bool) -> None:
    """Set this process's arithmetic (every setting, so that a process that runs several
    jobs, as tests do, keeps none of an earlier one's)."""
    import torch

    global _autocast
    _autocast = AUTOCAST.get(precision)
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    if deterministic:  # cuBLAS's deterministic workspace, read when CUDA starts
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if torch.are_deterministic_algorithms_enabled() != deterministic:  # the call imports
        torch.use_deterministic_algorithms(deterministic)  # torch._dynamo: 1 s, once asked
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = False


@contextlib.contextmanager
def norms_in_float32(model: torch.nn.Module) -> Iterator[None]:
    """Under bf16 autocast, `model`'s BatchNorm layers take their input in float32 and give
    their output back in the input's dtype: what the eager kernel computes from a bfloat16
    input and float32 weights (in float32 inside), but vmapped (the simulator's batched
    gradients) batch_norm takes no such mix and fails ("expected scalar type BFloat16 but
    found Float"). As it is without autocast or BatchNorm."""
    import torch

    if _autocast is None:  # nothing to do, and no walk of the model
        yield
        return
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._NormBase)]
    if not norms:
        yield
        return
    dtypes: list[torch.dtype] = []

    def to_float(module, args):
        dtypes.append(args[0].dtype)
        return (args[0].float(), *args[1:])

    def back(module, args, out):
        return out.to(dtypes.pop())

    hooks = [m.register_forward_pre_hook(to_float) for m in norms]
    hooks += [m.register_forward_hook(back) for m in norms]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """A forward pass on `device` under this process's precision: autocast to bfloat16 with
    precision=bf16, to float16 with fp16, else as it is."""
    import torch

    if _autocast is None or device.type == "meta":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, _autocast))


@stored
class LossScale:
    """One worker's loss scale under precision=fp16, kept as `torch.amp.GradScaler` keeps
    its own (a scale and a growth tracker, tensors on the worker's device) and updated by
    GradScaler's ops with its defaults: from 2**16, halved by a gradient holding an inf or a
    NaN, doubled after 2000 in a row without."""

    INIT, GROWTH, BACKOFF, INTERVAL = 2.0**16, 2.0, 0.5, 2000

    def __init__(self, device: torch.device):
        import torch

        self.scale = torch.full((), self.INIT, device=device)
        self.tracker = torch.zeros((), dtype=torch.int32, device=device)

    def unscaled(self, grads: Sequence[torch.Tensor]) -> bool:
        """`grads`, of the loss times `scale`, divided by it in place; the scale updated;
        whether they were all finite (the one wait on the device this adds to a step)."""
        import torch

        found, inverse = torch.zeros((), device=self.scale.device), self.scale.reciprocal()
        torch._amp_foreach_non_finite_check_and_unscale_(list(grads), found, inverse)
        torch._amp_update_scale_(self.scale, self.tracker, found, self.GROWTH, self.BACKOFF,
                                 self.INTERVAL)  # fmt: skip
        return not found.item()

    def again(self, loss: torch.Tensor) -> bool:
        """After an overflow: is the gradient worth computing again at the halved scale? Not
        when the loss itself is not finite (a diverged run: no scale helps) or the scale has
        come under 1 (the gradient overflows float16 unscaled)."""
        return bool(loss.isfinite()) and float(self.scale) >= 1.0


def loss_scale(device: torch.device) -> LossScale | None:
    """A worker's own `LossScale` under precision=fp16, else None (no scaling)."""
    return LossScale(device) if _autocast == "float16" and device.type != "meta" else None


def grads_of(
    loss_of: Callable[[], torch.Tensor],
    params: Sequence[torch.Tensor],
    scale: LossScale | None,
    buffers: Sequence[torch.Tensor],
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """The gradients of `loss_of()` with respect to `params`, and the loss. With a `scale`
    (fp16), of the scaled loss, unscaled; where they overflow, computed again at the scale
    backed off, `buffers` (the forward pass's BatchNorm statistics) as they were."""
    import torch

    if scale is None:
        loss = loss_of()
        return torch.autograd.grad(loss, params), loss
    kept = [b.clone() for b in buffers]
    while True:
        loss = loss_of()
        grads = torch.autograd.grad(loss * scale.scale, params)
        if scale.unscaled(grads) or not scale.again(loss):
            return grads, loss
        for buffer, was in zip(buffers, kept, strict=True):
            buffer.copy_(was)
