"""The real runtime's numerics against PyTorch's own synchronous data parallelism: from the
same θ₀ and the same per-rank data order, 50 steps of allreduce-BSP and of PS-BSP end with
parameters bit-identical to `DistributedDataParallel` over gloo with `torch.optim.SGD`
(2 processes, CPU); so do allreduce-BSP's overlapped rounds, in DDP-like buckets and in
P3's slices applied layer by layer; and with precision=bf16, allreduce-BSP in one message
and in buckets against DDP under `torch.autocast` to bfloat16. A harness that reordered a
sum, dropped a batch or applied a stale gradient would differ in the last bits at least.

The same holds for the update rules that are torch's optimizers (stalebench/algorithms/
torch_optim.py): allreduce-BSP with `algorithm/update=adamw|adam|nadam|torch_sgd` ends
bit-identical to DDP with torch.optim.AdamW, Adam, NAdam and SGD (Nesterov, heavy ball)
given the same lr, betas, eps and weight decay; so do allreduce-BSP's buckets and PS-BSP
(AdamW at the server) with AdamW. The references (plain SGD's too) are trained one after
the other in one pair of DDP processes, forked from the fork server the runs' ranks are
(torch imported once)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector

from tests.conftest import compose, fast_with, free_port, run_job
from tests.speed_helpers import fork_server_for_every_engine

STEPS = 50
ARGS = ["algorithm=bsp", "cluster.num_workers=2", f"budget.max_updates={STEPS}"]
BUCKETS = ["engine=allreduce", "engine.bucket_mb=0.0005"]  # 131 floats: 2 buckets, 8 slices


def _ddp_final(job, rank: int, optimizer, bf16: bool = False) -> torch.Tensor:
    """θ after STEPS steps of DDP from the job's θ₀ on its rank's stream, the optimizer
    made by `optimizer(parameters)`; `bf16`: the forward pass under autocast to bfloat16."""
    model = torch.nn.parallel.DistributedDataParallel(job.model())
    opt = optimizer(model.parameters())
    batches = job.batches(rank)
    for _ in range(STEPS):
        x, y = next(batches)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return parameters_to_vector(model.parameters()).detach().clone()


@pytest.fixture(scope="module", autouse=True)
def one_fork_server():
    """The runs here go from engine=allreduce to engine=ps and back: their ranks, and the
    DDP references', forked from one server (not one started again, torch imported again,
    at each change of engine)."""
    import stalebench.experiment  # noqa: F401  (registers the engines the server loads)

    fork_server_for_every_engine()


def final_params(run) -> torch.Tensor:
    assert run.summary["status"] == "completed" and run.summary["updates"] == STEPS
    return torch.cat([t.flatten() for t in torch.load(run.dir / "model.pt").values()])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_allreduce_bsp_and_ps_bsp_end_bit_identical_to_ddp(tmp_path, ddp_optimizers):
    reference = ddp_optimizers["sgd"]
    fifo = BUCKETS
    runs = {
        "allreduce": ["engine=allreduce"],
        "ps": ["engine=ps"],
        "buckets": fifo,
        "p3": [*fifo, "engine.schedule=p3"],
        "allreduce_bf16": ["engine=allreduce", "precision=bf16"],
        "buckets_bf16": [*fifo, "precision=bf16"],
    }
    for name, args in runs.items():
        ours = final_params(run_job(tmp_path / name, [*ARGS, *args]))
        want = ddp_optimizers["sgd_bf16"] if name.endswith("bf16") else reference
        assert ours.shape == want.shape
        assert torch.equal(ours, want), (name, (ours - want).abs().max())
    assert not torch.equal(ddp_optimizers["sgd_bf16"], reference)  # autocast took effect


# name: (stalebench's overrides, torch.optim's class and its arguments): the same numbers
# written twice, none left at its default, so a field that did not reach torch shows
TORCH_RULES = {
    "adamw": (
        ["algorithm/update=adamw", "algorithm.update.lr=0.01", "algorithm.update.beta1=0.8",
         "algorithm.update.beta2=0.99", "algorithm.update.eps=1e-6",
         "algorithm.update.weight_decay=0.05"],
        "AdamW", {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.05},
    ),
    "adam": (
        ["algorithm/update=adam", "algorithm.update.lr=0.005", "algorithm.update.beta1=0.85",
         "algorithm.update.beta2=0.995", "algorithm.update.weight_decay=0.001",
         "algorithm.update.amsgrad=true"],
        "Adam",
        {"lr": 0.005, "betas": (0.85, 0.995), "weight_decay": 0.001, "amsgrad": True},
    ),
    "nadam": (
        ["algorithm/update=nadam", "algorithm.update.lr=0.004", "algorithm.update.beta1=0.95",
         "algorithm.update.beta2=0.99", "algorithm.update.momentum_decay=0.01",
         "algorithm.update.weight_decay=0.02", "algorithm.update.decoupled_weight_decay=true"],
        "NAdam",
        {"lr": 0.004, "betas": (0.95, 0.99), "momentum_decay": 0.01, "weight_decay": 0.02,
         "decoupled_weight_decay": True},
    ),
    "nesterov": (
        ["algorithm/update=torch_sgd", "algorithm.update.lr=0.05",
         "algorithm.update.momentum=0.9", "algorithm.update.nesterov=true",
         "algorithm.update.weight_decay=0.001"],
        "SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.001},
    ),
    "heavy_ball": (
        ["algorithm/update=torch_sgd", "algorithm.update.lr=0.05",
         "algorithm.update.momentum=0.8", "algorithm.update.dampening=0.1"],
        "SGD", {"lr": 0.05, "momentum": 0.8, "dampening": 0.1},
    ),
}  # fmt: skip


def _ddp_optimizers(rank: int, port: int, overrides: list[str], out: str) -> None:
    """The reference with torch.optim.SGD at the job's lr (`sgd`), then every TORCH_RULES
    reference, one after the other, each from θ₀ and the start of the per-rank data
    streams, with a DDP model of its own."""
    from stalebench.job import Job

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    job = Job.build(compose(overrides))
    lr = job.cfg.algorithm.update.lr
    finals = {"sgd": _ddp_final(job, rank, lambda params: torch.optim.SGD(params, lr=lr))}
    finals["sgd_bf16"] = _ddp_final(job, rank, lambda p: torch.optim.SGD(p, lr=lr), bf16=True)
    for name, (_, optimizer, kwargs) in TORCH_RULES.items():
        make = getattr(torch.optim, optimizer)
        finals[name] = _ddp_final(job, rank, lambda params, m=make, k=kwargs: m(params, **k))
    if rank == 0:
        torch.save(finals, out)
    dist.barrier()
    os._exit(0)


@pytest.fixture(scope="module")
def ddp_optimizers(tmp_path_factory) -> dict[str, torch.Tensor]:
    out = str(tmp_path_factory.mktemp("ddp") / "ddp.pt")
    args = (free_port(), fast_with(ARGS), out)
    mp.start_processes(_ddp_optimizers, args=args, nprocs=2, start_method="forkserver")
    return torch.load(out)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "name, engine",
    [*((name, "allreduce") for name in TORCH_RULES), ("adamw", "buckets"), ("adamw", "ps")],
    ids=lambda v: v,
)
def test_torch_optimizer_rules_end_bit_identical_to_ddp_with_that_optimizer(
    tmp_path, ddp_optimizers, name, engine
):
    reference = ddp_optimizers[name]
    engines = {"allreduce": ["engine=allreduce"], "buckets": BUCKETS, "ps": ["engine=ps"]}
    ours = final_params(run_job(tmp_path, [*ARGS, *engines[engine], *TORCH_RULES[name][0]]))
    assert ours.shape == reference.shape
    assert torch.equal(ours, reference), (name, engine, (ours - reference).abs().max())
