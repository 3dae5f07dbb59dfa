"""Membership that grows back (`runtime.members`, `runtime.driver.rounds`): with
cluster.min_replicas, a replica silent past timeout_s is left out of the rounds, then — once
it wakes — stands by as a spare of its own place; rank 0 invites it in its next round's
order and every survivor welcomes it after that round, healed from a peer: θ (allreduce,
local) or z̄ (gossip) as they hold it. Each serverless engine, in both runtimes."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import torch

from stalebench import experiment
from stalebench.metrics.events import read_events
from stalebench.runtime import checkpoint
from tests.conftest import compose, fast_with
from tests.integration.test_quorum import one_fork_server  # noqa: F401 (its ranks' server)

pytestmark = pytest.mark.timeout(120)

ENGINES = {
    "allreduce": ["engine=allreduce", "algorithm=bsp"],
    "local": ["algorithm=diloco", "algorithm.outer.inner_steps=5"],
    "gossip": ["algorithm=dpsgd", "engine.sync_every=10"],
}
# worker 2 paused past 2 × timeout_s (the collective's wait, then the regroup's): left out,
# and back once it wakes. Virtual seconds in the simulator (a round of 5 ms), real ones in
# processes, with room on a loaded machine (timeout_s 1.5: left out by about 3.3 s, awake
# at 5.3 s)
TIMING = {
    "sim": ["timeout_s=0.2", "cluster.faults=[{worker:2,at_s:0.3,duration_s:1}]",
            "budget.max_updates=600", "checkpoint_every_s=0.25"],
    "real": ["timeout_s=1.5", "cluster.faults=[{worker:2,at_s:0.3,duration_s:5}]",
             "budget.max_updates=100000", "budget.max_wall_s=8", "checkpoint_every_s=1"],
}  # fmt: skip


def run(tmp_path: Path, runtime: str, engine: str):
    overrides = [f"runtime={runtime}", *ENGINES[engine], *TIMING[runtime],
                 "cluster.num_workers=4", "cluster.min_replicas=3"]  # fmt: skip
    if runtime == "sim" and engine == "local":  # an update is a round of 5 inner steps
        overrides.append("budget.max_updates=150")  # 3.75 s: back at about 1.4 s
    cfg = compose(fast_with(overrides))
    cfg.run_dir = str(tmp_path)
    summary = experiment.run(cfg)
    return summary, read_events(tmp_path / "events.jsonl")


def last_parts(run_dir: Path, after: int) -> tuple[int, list]:
    """The last checkpoint set after version `after`: its version and every rank's part."""
    events = read_events(run_dir / "events.jsonl")
    saved = [e["version"] for e in events if e.get("event") == "checkpoint"]
    version = max(v for v in saved if (run_dir / checkpoint.DIR / "parts" / str(v)).exists())
    assert version > after, (saved, after)
    return version, [checkpoint.load_part(run_dir, version, r) for r in range(4)]


@pytest.mark.parametrize(
    ("runtime", "engine"),
    [*(("sim", e) for e in ENGINES),
     *(pytest.param("real", e, marks=pytest.mark.slow) for e in ENGINES)],
)  # fmt: skip
def test_a_replica_left_out_comes_back_and_is_taken_in(tmp_path, runtime, engine):
    summary, events = run(tmp_path, runtime, engine)
    assert summary["status"] == "completed", summary["error"]
    assert summary["workers_lost"] == [2] and summary["workers_back"] == [2]
    assert summary["workers_replaced"] == []
    lost, back = [e for e in events if e["kind"] == "worker" and e["event"] in ("lost", "back")]
    assert (lost["event"], back["event"]) == ("lost", "back") and back["t"] > lost["t"]
    updates = [e for e in events if e["kind"] == "update"]
    last = max(e["version"] for e in updates)
    # worker 2 misses the rounds (gossip: iterations) from about its loss to its return, in
    # one stretch, then takes every one to the end beside the others
    mine = {e["version"] for e in updates if e["worker"] == 2}
    gone = [v for v in range(1, last + 1) if v not in mine]
    assert gone == list(range(gone[0], gone[-1] + 1)) and gone[0] <= lost["round"]
    joined = gone[-1] + 1
    after = collections.Counter(e["worker"] for e in updates if e["version"] >= joined)
    assert after == {w: last - joined + 1 for w in range(4)}
    if engine == "gossip":
        # it starts from z̄ (w = 1): at its first meeting back it is as near z̄ as the others
        first = min(e["version"] for e in updates if e["worker"] == 2 and "consensus" in e
                    and e["t"] >= back["t"])  # fmt: skip
        near = {e["worker"]: e["consensus"] for e in updates if e["version"] == first
                and "consensus" in e}  # fmt: skip
        assert near[2] <= 2 * max(near[w] for w in (0, 1, 3)), near
        _, parts = last_parts(tmp_path, joined)
        assert [p["part"]["me"] for p in parts] == [0, 1, 2, 3]
        assert all(torch.equal(p["part"]["z_mean"], parts[0]["part"]["z_mean"]) for p in parts)
        return
    # θ is its peers' from the round it joins: every rank's part of a later checkpoint holds
    # the same θ, bit for bit
    key = "params" if engine == "allreduce" else "theta"
    _, parts = last_parts(tmp_path, joined)
    assert all(torch.equal(p["part"][key], parts[0]["part"][key]) for p in parts[1:])


# A spare chosen in a round whose end is also a checkpoint's: the survivors welcome it and
# keep the checkpoint for a later round (the spare would take no part in it). Local SGD and
# D-PSGD failed here before ("worker 2 died"): the survivors' checkpoint barrier met the
# spare's first exchange.
HEALED = {
    "allreduce": ["engine=allreduce", "algorithm=bsp"],
    "local": ["algorithm=local_sgd"],
    "gossip": ["algorithm=dpsgd"],
}


@pytest.mark.parametrize("engine", list(HEALED))
def test_sim_a_spare_joins_where_a_checkpoint_falls_due(tmp_path, engine):
    overrides = ["runtime=sim", "logger=none", *HEALED[engine], "budget.max_updates=40",
                 "cluster.min_replicas=2", "cluster.spares=1", "checkpoint_every_s=0.2", "seed=3",
                 "cluster.faults=[{worker:2,at_s:0.3,action:die}]"]  # fmt: skip
    cfg = compose(overrides)  # the default cluster's steps: the loss in the first rounds
    cfg.run_dir = str(tmp_path)
    summary = experiment.run(cfg)
    assert summary["status"] == "completed", summary["error"]
    assert summary["workers_lost"] == [2] == summary["workers_replaced"]
    events = read_events(tmp_path / "events.jsonl")
    replaced = next(e["t"] for e in events if e.get("event") == "replaced")
    assert any(e.get("event") == "checkpoint" and e["t"] > replaced for e in events)
