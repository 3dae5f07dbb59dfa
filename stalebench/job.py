"""The pieces of a run every process builds identically from the config, and the run's
identity as summary.json reports it.

This module sits below the runtimes and the engines: it knows the config and the
components, not how a run is executed. What depends on the engine (how many processes
compute, whether they share one stream of data) is handed in by the caller.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import os
import platform
import re
from typing import TYPE_CHECKING, Any

from stalebench import placement, precision
from stalebench.cluster import Profile
from stalebench.config import RunConfig
from stalebench.data import DATASETS, Dataset, Splits, resolve_sharding, shard_batches
from stalebench.environment import PACKAGES, cpu, package_version
from stalebench.git import code_state
from stalebench.models import MODELS

if TYPE_CHECKING:
    import torch
    from torch import nn


def meta(cfg: RunConfig, num_workers: int) -> dict[str, Any]:
    """The run's identity, as summary.json reports it (`num_workers`: the processes that
    compute, which the engine knows)."""
    parts = cfg.named_parts  # a pipeline's schedule and optimizer, DiLoCo's outer and inner
    c = cfg.cluster
    # a step time from the model on a device (`runtime.compute`): what it came to
    compute = {"device": c.device, "precision": c.precision, "utilization": c.utilization,
               "compute_ms": c.compute_ms} if c.device else None  # fmt: skip
    return {
        "algorithm": cfg.label,
        "parts": parts,
        "barrier": parts.get("barrier"),  # null where the engine has no barrier
        "update_rule": parts.get("update"),
        "engine": cfg.engine.name,
        "runtime": cfg.runtime,
        "model": cfg.model.name,
        "dataset": cfg.dataset.name,
        "cluster": cfg.cluster.preset,
        "num_workers": num_workers,
        "seed": cfg.seed,
        "config_sha": config_sha(cfg),
        **({"compute": compute} if compute else {}),
        # the real compute's arithmetic (`precision`), recorded in summary.json only
        "arithmetic": {
            "precision": cfg.precision,
            "deterministic": cfg.deterministic,
            "compile": cfg.compile_backend if cfg.compile else False,
        },  # fmt: skip
        "step_time": step_time(cfg),  # summary.json only
        **({} if numerics(cfg) else {"numerics": False}),  # a cost-only run says so
        "host": {
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "load_avg": list(os.getloadavg()),
            **environment(),
            "accelerator": placement.accelerator(),  # the GPUs torch sees here, CUDA, cuDNN, NCCL
            "git": code_state(),  # the code that ran it
        },
    }


def step_time(cfg: RunConfig) -> str:
    """What a step's duration is: `measured` (real processes, no compute model: as long as
    its compute took, on the device it ran on), `emulated` (real processes, each step padded
    to the profile's drawn time: `cluster.compute_ms`; `overrun` counts those that took
    longer) or `modelled` (the simulator's virtual time)."""
    if cfg.runtime == "sim":
        return "modelled"
    return "emulated" if cfg.cluster.compute_ms > 0 else "measured"


def environment() -> dict[str, Any]:
    """What decides a run's floating-point results beside its config and seed: the CPU,
    torch's build (BLAS, the CPU capability its kernels dispatch to, its intra-op threads),
    Python and the versions of PACKAGES. summary.json records it in `host`;
    `stalebench-results` saves and checks it (the report reads it from the runs, or runs
    this function in a subprocess: reports do not import torch)."""
    import torch

    static = _static_environment()
    return {**static, "torch": {**static["torch"], "threads": torch.get_num_threads()}}


@functools.cache
def _static_environment() -> dict[str, Any]:
    import torch

    build = dict(re.findall(r"\b(BLAS_INFO|LAPACK_INFO)=([^,\s]+)", torch.__config__.show()))
    return {
        "cpu": cpu(),
        "torch": {
            "blas": build.get("BLAS_INFO"),
            "lapack": build.get("LAPACK_INFO"),
            "capability": torch.backends.cpu.get_cpu_capability(),
        },
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {p: package_version(p) for p in PACKAGES},
    }


def numerics(cfg: RunConfig) -> bool:
    """Whether the run computes values (gradients, updates, evaluations): every run but a
    cost-only simulation (`sim.numerics=false`)."""
    return cfg.runtime != "sim" or cfg.sim.numerics


def build_model(cfg: RunConfig, splits: Splits) -> nn.Module:
    """The model for `splits`' inputs and classes; in a cost-only run on the meta device,
    its tensors sizes without storage (a ResNet-50 or a VGG-19 costs no memory)."""
    import torch

    with torch.device("cpu" if numerics(cfg) else "meta"):
        return MODELS.build(cfg.model, splits.input_shape, splits.num_classes)


def config_sha(cfg: RunConfig) -> str:
    """A fingerprint of everything that decides what a run computes: the resolved config
    without where it is written and how a rerun treats an earlier one."""
    fields = dataclasses.asdict(cfg)
    for key in ("run_dir", "resume", "overwrite", "resume_unreadable", "checkpoint_every_s"):
        fields.pop(key, None)
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_splits(cfg: RunConfig, dataset: Dataset | None = None) -> Splits:
    """The dataset's splits as the run uses them (`dataset`: one already built from
    cfg.dataset): with eval.split=val, the training split less the validation examples it
    holds out (`Splits.hold_out`), which workers then shard."""
    splits = (dataset or DATASETS.build(cfg.dataset)).load()
    if cfg.eval.split == "val":
        return splits.hold_out(cfg.eval.validation_fraction)
    return splits


@dataclasses.dataclass
class Job:
    """The pieces every process of a run builds identically from the config.

    `num_workers` are the processes that compute (workers, replicas or stages); with
    `one_stream` they read one stream over the whole training split (a pipeline), otherwise
    each worker reads its shard as `dataset.sharding` says.
    """

    cfg: RunConfig
    splits: Splits
    profile: Profile
    num_workers: int
    one_stream: bool = False
    _meta_model: Any = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def build(cls, cfg: RunConfig, num_workers: int | None = None, one_stream: bool = False):
        """The job of a process that computes: its arithmetic set first (`precision`)."""
        precision.configure(cfg.precision, cfg.deterministic)
        n = cfg.cluster.num_workers if num_workers is None else num_workers
        return cls(cfg, load_splits(cfg), Profile(cfg.cluster, cfg.seed), n, one_stream)

    @property
    def meta(self) -> dict[str, Any]:
        return meta(self.cfg, self.num_workers)

    @property
    def numerics(self) -> bool:
        return numerics(self.cfg)

    @property
    def sharding(self) -> str:
        c = self.cfg
        if self.one_stream:
            return "replicated"  # one stream of microbatches, over the whole split
        return resolve_sharding(
            c.dataset.sharding,
            len(self.splits.y_train),
            self.num_workers,
            c.dataset.batch_size,
        )

    def batches(self, worker: int):
        """The endless minibatch stream of one worker, its shard one of the engine's
        `num_workers` (those that compute)."""
        c = self.cfg
        return shard_batches(
            self.splits, worker, self.num_workers, c.dataset.batch_size, c.seed,
            self.sharding, c.dataset.dirichlet_alpha, c.dataset.shuffle,
        )  # fmt: skip

    @property
    def sharding_fields(self) -> dict[str, Any]:
        """How the data is split, as the start event and summary.json record it; `one_stream`
        where the workers read one stream of microbatches (they are a pipeline's stages)."""
        out: dict[str, Any] = {"sharding": self.sharding}
        if out["sharding"] == "dirichlet":
            out["dirichlet_alpha"] = self.cfg.dataset.dirichlet_alpha
        if self.one_stream:
            out["one_stream"] = True
        return out

    def model(self, shared: bool = False) -> nn.Module:
        """The model with its seeded initial parameters θ₀ (the same in every process). A
        cost-only run's is on the meta device (sizes, no values), built once: a copy of it,
        or with `shared` that one model itself, for a caller that changes nothing in it (a
        copy of a large model costs more than all else a rank sets up)."""
        import torch

        if not self.numerics:  # on the meta device: built once (its init is slow there)
            if self._meta_model is None:
                self._meta_model = build_model(self.cfg, self.splits)
            return self._meta_model if shared else copy.deepcopy(self._meta_model)
        torch.manual_seed(self.cfg.seed)
        return build_model(self.cfg, self.splits)

    @property
    def host(self) -> torch.device:
        """Where a program keeps θ off the accelerator: the CPU, or in a cost-only run the
        meta device (a tensor's size, no values)."""
        import torch

        return torch.device("cpu" if self.numerics else "meta")

    def device(self, rank: int, serves: bool = False) -> torch.device:
        """Where the process of `rank` computes (`stalebench.placement`: a GPU of its host, by
        its local rank, when asked and present, else the CPU; in a cost-only run the meta
        device, where nothing is computed); a server (`Engine.serves`) by `server_device`,
        whose auto follows `device`. A rank's program takes its world's (`World.device`)."""
        asked = self.cfg.device
        if serves and self.cfg.server_device != "auto":
            asked = self.cfg.server_device
        index = placement.local_rank(rank)
        return placement.device_of(asked, self.numerics, index, placement.gpus())
