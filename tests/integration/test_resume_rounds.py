"""The engines without a server checkpoint every rank at once, at a round's end with nothing
in flight (`World.checkpoint`): each rank writes its part, then rank 0 commits the set. An
interrupted run resumed with resume=true ends as the uninterrupted run does: in the
simulator bit for bit (events.jsonl but for its `resume` line, and model.pt), for
engine=local (DiLoCo, streaming DiLoCo with engine.delay=0), engine=allreduce after a
replica was lost (over the replicas left), and gossip and DiLoCo healed by a spare; in real
processes, DiLoCo on 4 replicas stopped by SIGTERM ends with the same θ, bit for bit (its
rounds are synchronous and gloo's ring sums in a fixed order), each round once."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from stalebench import experiment
from stalebench.errors import ConfigError
from stalebench.metrics.events import read_events, schema_errors
from stalebench.runtime import checkpoint
from tests.conftest import compose

DIE = "cluster.faults=[{worker:2,at_s:0.5,action:die}]"
COMMON = ["cluster.num_workers=4", "dataset=synthetic", "model=mlp", "logger=none"]
SIM = {
    "diloco": ["algorithm=diloco", "algorithm.outer.inner_steps=10", "budget.max_updates=80",
               "checkpoint_every_s=2"],
    # the inner optimizer's scheduler goes on from its step (it was unpicklable: its
    # function is not data; now kept as its state_dict)
    "diloco-lr-decay": ["algorithm=diloco", "algorithm.outer.inner_steps=10",
                        "budget.max_updates=80", "checkpoint_every_s=2",
                        "algorithm.inner.lr_decay=cosine", "algorithm.inner.lr_decay_steps=400"],
    "streaming-diloco": ["algorithm=streaming_diloco", "engine.delay=0",
                         "algorithm.outer.inner_steps=10", "budget.max_updates=120",
                         "checkpoint_every_s=2"],
    # checkpoints after a replica was lost (it comes back as a spare), and after a spare
    # took a lost worker's place (its part is that worker's)
    "allreduce-lost": ["engine=allreduce", "algorithm=bsp", "budget.max_updates=600",
                       "checkpoint_every_s=1", "cluster.min_replicas=3", DIE],
    "diloco-healed": ["algorithm=diloco", "algorithm.outer.inner_steps=10",
                      "budget.max_updates=80", "checkpoint_every_s=2",
                      "cluster.min_replicas=3", "cluster.spares=1", DIE],
    "gossip-healed": ["algorithm=dpsgd", "budget.max_updates=500", "checkpoint_every_s=2",
                      "cluster.min_replicas=3", "cluster.spares=1", DIE],
}  # fmt: skip


def cli(run_dir: Path, args: list[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "stalebench.cli", *COMMON, *args, f"hydra.run.dir={run_dir}"],
        cwd=run_dir.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kwargs,
    )


def finished(proc: subprocess.Popen) -> None:
    _, err = proc.communicate(timeout=200)
    assert proc.returncode == 0, err[-3000:]


def interrupted(run_dir: Path, args: list[str], sig: signal.Signals) -> dict:
    """Run until its first checkpoint set is committed, then signal it; its summary."""
    proc = cli(run_dir, args)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "checkpoint" / "state.pt").exists():
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint in 120 s"
            time.sleep(0.02)
        proc.send_signal(sig)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, "the run ended before the signal: make it longer"
    return json.loads((run_dir / "summary.json").read_text())


def resumed_events(run_dir: Path) -> list[str]:
    """events.jsonl's lines, its `resume` line taken out (checked: one, at a checkpoint)."""
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    (at,) = [i for i, e in enumerate(events) if e.get("event") == "resume"]
    assert events[at - 1]["event"] == "checkpoint"
    assert events[at - 1]["version"] == events[at]["version"]
    return lines[:at] + lines[at + 1 :]


def same_model(a: Path, b: Path) -> bool:
    x, y = torch.load(a / "model.pt"), torch.load(b / "model.pt")
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(SIM))
def test_sim_an_interrupted_run_resumed_is_the_uninterrupted_one(tmp_path, case):
    args = ["runtime=sim", *SIM[case]]
    whole = cli(tmp_path / "whole", args)
    stopped = interrupted(tmp_path / "run", args, signal.SIGINT)
    assert stopped["status"] == "interrupted"
    again = cli(tmp_path / "run", [*args, "resume=true"])
    finished(whole)
    finished(again)
    expected = (tmp_path / "whole" / "events.jsonl").read_text().splitlines()
    assert sum('"event": "checkpoint"' in line for line in expected) >= 2
    assert resumed_events(tmp_path / "run") == expected
    assert same_model(tmp_path / "whole", tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed"


REAL_DILOCO = ["runtime=real", "algorithm=diloco", "algorithm.outer.inner_steps=5",
               "budget.max_updates=24", "cluster.compute_ms=10", "checkpoint_every_s=0.4",
               "timeout_s=20"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_real_diloco_stopped_by_sigterm_resumes_to_the_same_theta(tmp_path):
    whole = cli(tmp_path / "whole", REAL_DILOCO)
    finished(whole)
    run_dir = tmp_path / "run"
    stopped = interrupted(run_dir, REAL_DILOCO, signal.SIGTERM)
    assert stopped["status"] == "interrupted" and stopped["updates"] < 24
    finished(cli(run_dir, [*REAL_DILOCO, "resume=true"]))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["updates"] == 24
    events = read_events(run_dir / "events.jsonl")
    assert not [e for e in events if schema_errors(e)]
    (resume,) = [e for e in events if e.get("event") == "resume"]
    assert resume["version"] > 0
    for w in range(4):  # each round once per worker, in order, across the resume
        rounds = [e["version"] for e in events if e["kind"] == "update" and e["worker"] == w]
        assert rounds == list(range(1, 25))
    times = [e["t"] for e in events if e["kind"] != "eval"]
    assert times == sorted(times)
    assert same_model(tmp_path / "whole", run_dir)
    # the committed set alone is kept
    committed = checkpoint.read(run_dir / "checkpoint" / "state.pt")
    parts = run_dir / "checkpoint" / "parts"
    assert [p.name for p in parts.iterdir()] == [str(committed["version"])]
    assert sorted(p.name for p in (parts / str(committed["version"])).iterdir()) == [
        f"rank-{r}.pt" for r in range(4)
    ]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_real_allreduce_healed_then_stopped_resumes_with_the_spare_in_place(tmp_path):
    # worker 2 dies, spare rank 4 takes its place, a checkpoint, SIGTERM: the resumed run
    # goes on over ranks 0, 1, 3, 4 (rank 2, started again, stands by) to the budget
    args = ["runtime=real", "engine=allreduce", "algorithm=bsp", "budget.max_updates=300",
            "cluster.compute_ms=10", "checkpoint_every_s=0.5", "timeout_s=20",
            "cluster.min_replicas=3", "cluster.spares=1",
            "cluster.faults=[{worker:2,at_s:0.3,action:die}]"]  # fmt: skip
    run_dir = tmp_path / "run"
    proc = cli(run_dir, args)
    try:  # stopped once a checkpoint after the spare's arrival is committed
        deadline = time.monotonic() + 120
        while not _checkpoint_after_replaced(run_dir):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint after the spare joined"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    finished(cli(run_dir, [*args, "resume=true"]))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["updates"] == 300
    assert summary["workers_lost"] == [2] and summary["workers_replaced"] == [2]
    events = read_events(run_dir / "events.jsonl")
    (resume,) = [e for e in events if e.get("event") == "resume"]
    for w in range(4):  # each round once per worker (worker 2 missed the one it was lost in)
        rounds = [e["version"] for e in events if e["kind"] == "update" and e["worker"] == w]
        assert rounds == sorted(set(rounds)) and len(rounds) >= 299
        assert [v for v in rounds if v > resume["version"]] == list(
            range(resume["version"] + 1, 301)
        )
    assert "rank 2 of 5" in (run_dir / "logs" / "rank-2.log").read_text()


def _checkpoint_after_replaced(run_dir: Path) -> bool:
    events = read_events(run_dir / "events.jsonl") if (run_dir / "events.jsonl").exists() else []
    replaced = [i for i, e in enumerate(events) if e.get("event") == "replaced"]
    return bool(replaced) and any(e.get("event") == "checkpoint" for e in events[replaced[0] :])


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        (["algorithm=asp"], "checkpoint_every_s=5: engine=ps keeps none in runtime=sim"),
        (
            ["algorithm=streaming_diloco"],
            "engine.mode=streaming with engine.delay=5: an exchange is always in flight",
        ),
        (["algorithm=hpsgd"], "engine.mode=overlap: an exchange is always in flight"),
        (["algorithm=osgp"], "algorithm.gossip.overlap=1: messages are always in flight"),
        (["algorithm=async_diloco"], "engine.mode=async keeps none"),
        (["algorithm=gpipe"], "engine=pipeline keeps none in runtime=sim"),
    ],
    ids=["ps-sim", "streaming-delay", "overlap", "osgp", "async", "pipeline"],
)
def test_checkpoints_refused_where_they_cannot_be_kept(extra, key):
    cfg = compose(["runtime=sim", "checkpoint_every_s=5", *extra])
    with pytest.raises(ConfigError, match=re.escape(key)):
        experiment.prepare(cfg)
