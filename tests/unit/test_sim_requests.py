"""The simulator's requests (`runtime.sim.Request`): what a rank's world yields the scheduler
when it waits is one of its typed requests, each handling itself; anything else a program
yields is an error that names it, never taken for a collective."""

from __future__ import annotations

import pytest
import torch

from stalebench.errors import RunError
from stalebench.job import Job
from stalebench.runtime import sim
from stalebench.runtime.sim import Simulator
from tests.conftest import compose, fast_with


def simulator(tmp_path, size: int = 2) -> Simulator:
    over = ["runtime=sim", "budget.max_updates=10", f"cluster.num_workers={size}"]
    cfg = compose(fast_with(over))
    cfg.run_dir = str(tmp_path)
    return Simulator(Job.build(cfg), tmp_path, size)


@pytest.mark.parametrize("stray", [("collective",), ("recv", 0), None], ids=repr)
def test_an_unknown_request_is_an_error_naming_it_not_a_collective(tmp_path, stray):
    """Rank 1 yields what no world yields (the old tagged tuples, or a bare `yield`): the
    run stops there with an error naming the rank and what it yielded; rank 0, in an
    all-reduce, never sees it completed as if rank 1 had come to it."""
    ended = []

    def program(job, world):
        yield from world.begin(lambda: None)
        if world.rank == 1:
            yield stray
        yield from world.all_reduce(torch.ones(1))
        ended.append(world.rank)

    with pytest.raises(RunError) as caught:
        simulator(tmp_path).run(program)
    assert str(caught.value) == f"rank 1 yielded {stray!r}, not a simulator request"
    assert ended == []


def test_each_request_is_named_as_a_rank_that_waits_forever_says():
    """`name` is what `_time_out`'s error shows: "rank r waits forever (<name>)"."""
    names = {
        type(r).__name__: r.name
        for r in (sim.Begin(), sim.Sleep(), sim.Recv(0, 0.0), sim.Listen(0.0), sim.StandBy(),
                  sim.Welcome(None), sim.Await())
    }  # fmt: skip
    assert names == {
        "Begin": "begin", "Sleep": "sleep", "Recv": "recv", "Listen": "listen",
        "StandBy": "standby", "Welcome": "welcome", "Await": "collective",
    }  # fmt: skip
    assert all(issubclass(getattr(sim, n), sim.Request) for n in names)


def test_a_rank_that_waits_forever_in_a_collective_says_so(tmp_path):
    """Rank 0 waits in an all-reduce rank 1 never comes to: the run fails naming the wait."""

    def program(job, world):
        yield from world.begin(lambda: None)
        if world.rank == 0:
            try:
                yield from world.all_reduce(torch.ones(1))
            except RunError as exc:
                return world.record.fail(world.now(), 0, str(exc))
        return None

    summary = simulator(tmp_path).run(program)
    assert summary["status"] == "failed"
    assert "rank 0 waits forever (collective)" in summary["error"]
