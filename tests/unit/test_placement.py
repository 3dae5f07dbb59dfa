"""Where a rank computes (`stalebench.placement`): its host's GPU of its local rank —
torchrun's LOCAL_RANK, SLURM's SLURM_LOCALID, or its rank under the spawn launcher —, the
CPU, or the meta device; what summary.json records of it; device=auto on a machine without
a GPU says so in one line."""

from __future__ import annotations

import json

import pytest
import torch

from stalebench import experiment, placement
from stalebench.errors import ConfigError
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


def test_a_server_takes_server_device_and_the_workers_device(monkeypatch):
    """The parameter server (rank 0, `Engine.serves`) by server_device, whose auto follows
    `device`; its workers by `device`; an engine without a server refuses server_device=cuda."""
    monkeypatch.setattr(placement, "gpus", lambda: 8)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("SLURM_LOCALID", raising=False)
    base = ["runtime=real", "budget.max_updates=5"]
    for devices, server, worker in [
        (["device=auto"], "cuda:0", "cuda:2"),  # auto: a GPU of its host
        (["device=auto", "server_device=cpu"], "cpu", "cuda:2"),  # today's server
        (["device=cpu", "server_device=cuda"], "cuda:0", "cpu"),
        (["device=cpu"], "cpu", "cpu"),  # auto follows device
    ]:
        cfg = compose(fast_with([*base, *devices]))
        engine, job = experiment.engine_of(cfg), Job.build(cfg, 2, False)
        assert [engine.serves(r) for r in range(3)] == [True, False, False]
        assert job.device(0, engine.serves(0)) == torch.device(server), devices
        assert job.device(2, engine.serves(2)) == torch.device(worker), devices
    asynchronous = compose(fast_with([*base, "algorithm=async_diloco"]))
    assert experiment.engine_of(asynchronous).serves(0)
    for collective in (["engine=allreduce", "algorithm=bsp"], ["algorithm=diloco"]):
        engine = experiment.engine_of(compose(fast_with([*base, *collective])))
        assert not any(map(engine.serves, range(engine.world_size())))


def test_server_device_is_checked_by_name():
    with pytest.raises(ConfigError, match="server_device must be auto, cpu or cuda, got 'gpu'"):
        compose(fast_with(["budget.max_updates=5", "server_device=gpu"]))
    if torch.cuda.is_available():
        return
    cfg = compose(fast_with(["runtime=sim", "budget.max_updates=5", "server_device=cuda"]))
    with pytest.raises(ConfigError, match=r"server_device=cuda but CUDA is not available here"):
        experiment.prepare(cfg)


def test_summary_names_each_ranks_host_and_device_and_the_accelerator(tmp_path):
    cfg = compose(fast_with(["runtime=sim", "cluster.num_workers=3", "budget.max_updates=5"]))
    cfg.run_dir = str(tmp_path)
    experiment.run(cfg)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [r["rank"] for r in summary["ranks"]] == list(range(len(summary["ranks"])))
    assert {r["device"] for r in summary["ranks"]} == {"cpu"} and summary["ranks"][0]["host"]
    assert summary["step_time"] == "modelled"  # virtual time
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


def test_a_gpu_run_whose_steps_are_padded_says_so_in_one_line(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    padded = ["runtime=real", "budget.max_updates=5", "cluster.compute_ms=20"]
    experiment.say_device(compose(fast_with(padded)))
    assert capsys.readouterr().err.splitlines() == [
        "stalebench: the workers compute on GPUs, each step padded to cluster=homogeneous's "
        "emulated 20 ms (cluster.compute_ms=0: as long as the GPU takes)"
    ]
    for quiet in (["cluster.compute_ms=0"], ["device=cpu"], ["runtime=sim"]):
        experiment.say_device(compose(fast_with([*padded, *quiet])))
        assert capsys.readouterr().err == ""
