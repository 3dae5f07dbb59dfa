"""Where a rank computes, chosen once per process as DDP chooses it: a rank that computes on
a GPU takes its host's GPU of its local rank — its index among the run's processes on its
host: torchrun's `LOCAL_RANK`, SLURM's `SLURM_LOCALID`, or under the spawn launcher (every
rank on this host) its rank — modulo the host's GPUs, set as the process's current device
once (`use`). `device=cpu` keeps every rank on the CPU; `device=auto` uses the GPUs where
there are any (on a machine without, the run says so in one line before it starts); a
cost-only simulation computes nothing, on the meta device.

What summary.json records of it: the machine's accelerator (`accelerator()`: the GPU model
and count, torch's CUDA, cuDNN and NCCL versions) and each rank's host and device
(`World.placed`)."""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

LOCAL_ENV = ("LOCAL_RANK", "SLURM_LOCALID")  # torchrun's, then SLURM's (srun)


def local_rank(rank: int, env: Mapping[str, str] = os.environ) -> int:
    """This process's index among the run's processes on its host (`LOCAL_ENV`), or under
    the spawn launcher, which starts every rank on this host, `rank`."""
    for key in LOCAL_ENV:
        if key in env:
            return int(env[key])
    return rank


def device_of(asked: str, numerics: bool, index: int, gpus: int) -> torch.device:
    """The device of the process of local rank `index` on a host of `gpus` GPUs, for
    `device=asked` (auto | cpu | cuda): the meta device in a cost-only run."""
    import torch

    if not numerics:
        return torch.device("meta")
    if asked != "cpu" and gpus > 0:
        return torch.device("cuda", index % gpus)
    return torch.device("cpu")


def gpus() -> int:
    """This host's GPUs that torch sees (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def use(device: torch.device) -> None:
    """Make `device` this process's current CUDA device (a CPU or meta device: nothing), as
    DDP's `torch.cuda.set_device(LOCAL_RANK)`: allocations and kernels without a device go
    there, and NCCL binds it."""
    import torch

    if device.type == "cuda":
        torch.cuda.set_device(device)  # CUDA only


def host_buffer(size: int, pinned: bool) -> torch.Tensor:
    """A float32 buffer of `size` in host memory; `pinned`: page-locked (a rank on a GPU: its
    copies to and from the device are asynchronous, `non_blocking`, and run at the bus's
    rate; pageable memory is copied through a staging buffer, blocking)."""
    import torch

    return torch.empty(size, pin_memory=pinned)  # pinned: CUDA only


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on `device` (a GPU's stream runs ahead of the host: an
    asynchronous copy into host memory is there only once this returns); nothing elsewhere."""
    import torch

    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()  # CUDA only


def on_host(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` in host memory, for a collective over gloo: itself where it is already
    there (the CPU; the meta device of a cost-only run); from a GPU, a page-locked copy,
    waited for."""
    import torch

    if tensor.device.type != "cuda":
        return tensor
    out = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)  # CUDA only
    out.copy_(tensor, non_blocking=True)
    synchronize(tensor.device)
    return out


def placed(rank: int, device: torch.device) -> dict[str, Any]:
    """One rank's entry in summary.json's `ranks`: its host and device."""
    return {"rank": rank, "host": socket.gethostname(), "device": str(device)}


@functools.cache
def accelerator() -> dict[str, Any]:
    """The machine's accelerator as summary.json records it: the GPU model and count (0 on a
    machine without CUDA), and the CUDA, cuDNN and NCCL versions torch was built with
    (None where it has none)."""
    import torch

    count = gpus()
    nccl = None
    if count and torch.distributed.is_nccl_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version()))  # CUDA only
    return {
        "gpus": count,
        "gpu": torch.cuda.get_device_name(0) if count else None,  # CUDA only
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if count else None,  # CUDA only
        "nccl": nccl,
    }
