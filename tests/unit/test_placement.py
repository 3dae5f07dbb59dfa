"""Where a rank computes (`stalebench.placement`): its host's GPU of its local rank —
torchrun's LOCAL_RANK, SLURM's SLURM_LOCALID, or its rank under the spawn launcher —, the
CPU, or the meta device; what summary.json records of it; device=auto on a machine without
a GPU says so in one line."""

from __future__ import annotations

import json

import pytest
import torch

from stalebench import experiment, placement
from stalebench.job import Job
from tests.conftest import compose, fast_with


@pytest.mark.parametrize(
    ("env", "rank", "local"),
    [
        ({}, 5, 5),  # the spawn launcher: every rank on this host
        ({"LOCAL_RANK": "3"}, 11, 3),  # torchrun
        ({"SLURM_LOCALID": "2"}, 9, 2),  # srun
        ({"LOCAL_RANK": "1", "SLURM_LOCALID": "6"}, 9, 1),  # torchrun inside an allocation
    ],
)
def test_a_ranks_index_on_its_host(env, rank, local):
    assert placement.local_rank(rank, env) == local


@pytest.mark.parametrize(
    ("asked", "numerics", "index", "gpus", "device"),
    [
        ("auto", True, 5, 4, "cuda:1"),  # its host's GPU of its local rank, modulo the GPUs
        ("cuda", True, 3, 8, "cuda:3"),
        ("auto", True, 3, 0, "cpu"),  # no GPU here
        ("cpu", True, 3, 8, "cpu"),
        ("cuda", False, 3, 8, "meta"),  # a cost-only simulation computes nothing
    ],
)
def test_the_device_of_a_local_rank(asked, numerics, index, gpus, device):
    assert placement.device_of(asked, numerics, index, gpus) == torch.device(device)


def test_a_job_places_a_rank_by_the_launchers_local_rank(monkeypatch):
    # torchrun's rank 6 on its host's second process, of a host with 4 GPUs: cuda:1
    cfg = compose(fast_with(["runtime=real", "device=auto", "budget.max_updates=5"]))
    job = Job.build(cfg, 2, False)
    monkeypatch.setattr(placement, "gpus", lambda: 4)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert job.device(6) == torch.device("cuda", 1)
    monkeypatch.delenv("LOCAL_RANK")
    assert job.device(6) == torch.device("cuda", 2)  # spawned: its rank on this host
    monkeypatch.setattr(placement, "gpus", lambda: 0)
    assert job.device(6) == torch.device("cpu")


def test_summary_names_each_ranks_host_and_device_and_the_accelerator(tmp_path):
    cfg = compose(fast_with(["runtime=sim", "cluster.num_workers=3", "budget.max_updates=5"]))
    cfg.run_dir = str(tmp_path)
    experiment.run(cfg)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [r["rank"] for r in summary["ranks"]] == list(range(len(summary["ranks"])))
    assert {r["device"] for r in summary["ranks"]} == {"cpu"} and summary["ranks"][0]["host"]
    gpu = summary["host"]["accelerator"]
    if not torch.cuda.is_available():
        assert gpu == {"gpus": 0, "gpu": None, "cuda": torch.version.cuda, "cudnn": None,
                       "nccl": None}  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU")
def test_device_auto_without_a_gpu_says_so_in_one_line(capsys):
    auto = ["runtime=sim", "device=auto", "budget.max_updates=5"]
    experiment.say_device(compose(fast_with(auto)))
    said = capsys.readouterr().err.splitlines()
    assert said == ["stalebench: device=auto: no CUDA device here, every rank computes on the CPU"]
    for quiet in (["device=cpu"], ["device=auto", "sim.numerics=false"]):
        experiment.say_device(compose(fast_with(["runtime=sim", "budget.max_updates=5", *quiet])))
        assert capsys.readouterr().err == ""
