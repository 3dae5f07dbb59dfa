"""Which torchrun process plays rank 0 (runtime/nodes.py): the owner node's first process,
whatever rank the rendezvous gave it; the others in torchrun's order."""

import pytest

from stalebench.errors import RunError
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
