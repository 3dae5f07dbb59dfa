"""The arithmetic of a run's real compute — the workers' forward and backward passes in
both runtimes (one at a time, or the simulator's batched gradients) — set once per process
from the config, as torchtitan sets its mixed precision:

- `precision=fp32` (the default): float32 throughout, TF32 off for CUDA's matmuls and
  cuDNN's convolutions (cuDNN allows TF32 unless told otherwise: stated here);
- `tf32`: float32 tensors, CUDA's matmuls and convolutions in TF32;
- `bf16`: the forward pass under `torch.autocast` to bfloat16 (θ, its gradient and the
  update stay float32, as with DDP and autocast);
- `fp16` is refused: it needs loss scaling (a GradScaler), not built yet.

`deterministic=true` turns on torch's deterministic algorithms (cuDNN's too, its
benchmark off; CUBLAS_WORKSPACE_CONFIG set for cuBLAS). Both are recorded in summary.json
(`arithmetic`). The simulator's modelled step time has its own `cluster.precision`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_autocast: str | None = None  # the dtype's name under autocast (bf16), once `configure`d


def configure(precision: str, deterministic: bool) -> None:
    """Set this process's arithmetic (every setting, so that a process that runs several
    jobs, as tests do, keeps none of an earlier one's)."""
    import torch

    global _autocast
    _autocast = "bfloat16" if precision == "bf16" else None
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
    precision=bf16, else as it is."""
    import torch

    if _autocast is None or device.type == "meta":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, _autocast))
