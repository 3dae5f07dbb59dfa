"""Which torchrun process plays rank 0 (runtime/nodes.py): the owner node's first process,
whatever rank the rendezvous gave it; the others in torchrun's order."""

import os
import time

import pytest

from stalebench.errors import ConfigError, RunError
from stalebench.runtime import nodes


def test_the_owner_node_s_processes_come_first_in_torchrun_s_order():
    # torchrun ranks 0, 1 on node 0 (not the owner), 2, 3 on node 1 (the owner)
    assert nodes.roles(["0", "0", "1", "1"], ["0", "0", "1", "1"]) == [2, 3, 0, 1]
    assert nodes.roles(["1", "1", "0", "0"], ["0", "0", "1", "1"]) == [0, 1, 2, 3]


def test_without_the_variable_torchrun_s_order_stands():
    assert nodes.roles(["", "", ""], ["0", "0", "1"]) == [0, 1, 2]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["1", "1", "1", "1"], "STALEBENCH_RUN_DIR_NODE=1 on 2 nodes: set it on one"),
        (["0", "0", "", ""], "STALEBENCH_RUN_DIR_NODE=0 on some node but =1 on none"),
    ],
)
def test_an_ambiguous_owner_is_refused(flags, message):
    with pytest.raises(RunError, match=message):
        nodes.roles(flags, ["0", "0", "1", "1"])


@pytest.mark.parametrize(
    "env, owns",
    [
        ({}, True),  # spawned by stalebench itself
        ({"RANK": "0", "LOCAL_RANK": "0"}, True),
        ({"RANK": "2", "LOCAL_RANK": "0"}, False),
        ({"RANK": "2", "LOCAL_RANK": "0", "STALEBENCH_RUN_DIR_NODE": "1"}, True),
        ({"RANK": "3", "LOCAL_RANK": "1", "STALEBENCH_RUN_DIR_NODE": "1"}, False),
        ({"RANK": "0", "LOCAL_RANK": "0", "STALEBENCH_RUN_DIR_NODE": "0"}, False),
    ],
)
def test_a_process_knows_before_hydra_whether_it_plays_rank_0(monkeypatch, env, owns):
    for key in ("RANK", "LOCAL_RANK", "STALEBENCH_RUN_DIR_NODE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert nodes.owns_run_dir() is owns


@pytest.fixture
def store_env(monkeypatch):
    """A fresh TCPStore this process hosts, as env:// rank 0 (nodes.store's connection)."""
    from tests.conftest import free_port

    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                       "RANK": "0", "WORLD_SIZE": "2"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    monkeypatch.setattr(nodes, "_main", None)
    yield
    nodes._beating.set()  # this test's beat stops


def test_a_refusal_posted_by_one_process_is_raised_in_the_others_wait(store_env):
    shared = nodes.store(nodes.FORMING)
    shared.set("checked/0", "1")
    nodes.tell_refusal("dataset.root: no files here")
    nodes.tell_refusal("a later refusal")  # the first stands
    with pytest.raises(ConfigError, match="^dataset.root: no files here$"):
        nodes.wait_all(shared, ["checked/0", "checked/1"], "checking the input")


def test_a_process_ending_on_a_refusal_waits_until_every_process_is(store_env, monkeypatch):
    """Rank 0 refused and said its line: it returns (to exit) once rank 1 is ending on it
    too, or after HEARD_S without it (a process that never came), not before."""
    import threading
    from datetime import timedelta

    monkeypatch.setattr(nodes, "HEARD_S", 0.5)
    nodes.tell_refusal("dataset.root: no files here")
    start = time.monotonic()
    nodes.ending_on_refusal()
    assert 0.5 <= time.monotonic() - start < 5  # rank 1 never said it: HEARD_S, no more

    monkeypatch.setattr(nodes, "JOB", "1")  # the next job of a sweep, under its own prefix
    monkeypatch.setattr(nodes, "HEARD_S", 60.0)
    rank_1 = nodes._prefixed(nodes._connect(timedelta(seconds=5)))  # its own connection
    threading.Timer(0.5, rank_1.set, ("heard/1", "1")).start()
    start = time.monotonic()
    nodes.ending_on_refusal()
    assert 0.5 <= time.monotonic() - start < 30  # as soon as rank 1 said it


def test_each_job_of_a_sweep_meets_under_its_own_prefix(store_env, monkeypatch):
    nodes.store(nodes.FORMING).set("checked/0", "1")
    monkeypatch.setattr(nodes, "JOB", "1")
    assert not nodes.store(nodes.FORMING).check(["checked/0"])


def test_rank_0_is_alive_while_it_beats(store_env, monkeypatch):
    monkeypatch.setattr(nodes, "BEAT_S", 0.05)
    shared = nodes.store(nodes.FORMING)
    assert not nodes.rank_0_alive(shared)  # no beat yet
    nodes.beat(nodes.FORMING)
    assert nodes.rank_0_alive(shared)
    nodes._beating.set()
    time.sleep(2 * nodes.BEAT_S)
    assert not nodes.rank_0_alive(shared)


def test_a_launch_of_the_wrong_size_is_refused_naming_what_to_set(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    nodes.check_size(2, "engine=ps with cluster.num_workers=1")
    with pytest.raises(ConfigError, match="starts 2 processes, but engine=ps .* runs 3: set "
                       "torchrun's nproc_per_node × nnodes to 3"):  # fmt: skip
        nodes.check_size(3, "engine=ps with cluster.num_workers=2")
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    with pytest.raises(ConfigError, match="hydra.launcher.tasks_per_node × hydra.launcher.nodes"):
        nodes.check_size(3, "engine=ps with cluster.num_workers=2")


def test_a_submitit_task_takes_its_rank_from_slurms_environment(monkeypatch):
    env = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "4",
           "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1", "SLURM_PROCID": "3",
           "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_STEP_NODELIST":
           "gpu[07-08]"}  # fmt: skip
    # a copy of the environment, given back at the end: what submitit's helper exports
    # (RANK, WORLD_SIZE, ...) must not reach the next tests of this process
    monkeypatch.setattr(os, "environ", dict(os.environ))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"):
        os.environ.pop(key, None)
    os.environ.update(env)
    assert nodes.from_submitit()
    got = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK")}
    assert got == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "GROUP_RANK": "1"}
    assert os.environ["MASTER_ADDR"] == "gpu07" and not nodes.owns_run_dir()
    assert not nodes.from_submitit()  # once: RANK is set


def test_a_rank_off_rank_0s_node_logs_on_its_own(monkeypatch, tmp_path):
    monkeypatch.setattr(nodes, "NODE_OF", ["0", "0", "1"])
    run_dir = tmp_path / "run"
    assert nodes.log_dir(run_dir, 1) == run_dir / "logs"
    own = nodes.log_dir(run_dir, 2)
    assert own == nodes.own_log_dir(run_dir) and not own.is_relative_to(run_dir)
