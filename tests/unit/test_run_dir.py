"""A run directory holds one run: a second run into it is refused before anything is
written, unless `overwrite=true` (replace it) or `resume=true` (keep it when it completed
with this very config, go on from its checkpoint of this config, else run again from the
start). Simulated runs, in process, and checkpoints written by `Checkpoints`."""

from __future__ import annotations

import json
import re

import pytest

from stalebench import experiment
from stalebench.evaluation import Snapshots
from stalebench.job import config_sha
from stalebench.metrics.events import EventLog, read_events
from stalebench.runtime.checkpoint import Checkpoints
from tests.conftest import compose, fast_with

SIM = ["runtime=sim", "budget.max_updates=30"]


def _run(run_dir, *extra):
    cfg = compose(fast_with([*SIM, *extra]))
    cfg.run_dir = str(run_dir)
    return experiment.run(cfg)


def _files(run_dir):
    return {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}


def test_a_second_run_into_a_held_directory_is_refused_and_changes_nothing(tmp_path):
    first = _run(tmp_path)
    before = _files(tmp_path)
    with pytest.raises(experiment.RunDirTaken) as err:
        _run(tmp_path)
    assert str(err.value) == (
        f"run_dir={tmp_path} already holds a run (completed); set resume=true to keep it if it "
        "completed with this config (else continue or run again), or overwrite=true to "
        "replace it"
    )
    assert _files(tmp_path) == before and first["status"] == "completed"


def test_a_directory_with_only_events_counts_as_held(tmp_path):
    (tmp_path / "events.jsonl").write_text('{"kind": "system", "t": 0.0, "event": "start"}\n')
    with pytest.raises(experiment.RunDirTaken, match=re.escape("(no summary.json)")):
        _run(tmp_path)


def test_overwrite_replaces_the_run(tmp_path):
    _run(tmp_path, "seed=1")
    summary = _run(tmp_path, "seed=2", "overwrite=true")
    events = read_events(tmp_path / "events.jsonl")
    assert [e["event"] for e in events if e["kind"] == "system"].count("start") == 1
    assert summary["seed"] == 2 and json.loads((tmp_path / "summary.json").read_text())["seed"] == 2


def test_resume_keeps_a_run_that_completed_with_the_same_config(tmp_path):
    first = _run(tmp_path)
    before = _files(tmp_path)
    kept = _run(tmp_path, "resume=true")
    assert kept == first and _files(tmp_path) == before  # nothing trained, nothing written


def test_resume_runs_again_from_the_start_when_the_config_differs(tmp_path):
    _run(tmp_path)
    before = _files(tmp_path)
    summary = _run(tmp_path, "resume=true", "budget.max_updates=40")
    events = read_events(tmp_path / "events.jsonl")
    assert summary["updates"] == 40
    assert [e["event"] for e in events if e["kind"] == "system"].count("start") == 1
    assert _files(tmp_path / "previous" / "1") == before  # the earlier run, kept aside


def test_resume_runs_again_a_run_that_did_not_complete(tmp_path):
    died = _run(tmp_path, "cluster.faults=[{worker:1,at_s:0.01,action:die}]")
    assert died["status"] == "failed"
    again = _run(tmp_path, "cluster.faults=[{worker:1,at_s:0.01,action:die}]", "resume=true")
    assert again["status"] == "failed"  # run again (and failed again), not kept
    events = read_events(tmp_path / "events.jsonl")
    assert [e["event"] for e in events if e["kind"] == "system"].count("start") == 1


def test_the_config_fingerprint_ignores_where_and_how_a_run_is_written_only():
    base = compose(fast_with(SIM))
    same = compose(fast_with([*SIM, "resume=true", "overwrite=true", "checkpoint_every_s=5"]))
    same.run_dir = "elsewhere"
    assert config_sha(base) == config_sha(same)
    for change in ("seed=1", "algorithm.update.lr=0.2", "cluster.num_workers=3"):
        assert config_sha(compose(fast_with([*SIM, change]))) != config_sha(base), change


def _checkpointed_run(run_dir, cfg):
    """A run that wrote a checkpoint at version 2, then more events and a summary (stopped);
    returns the bytes of events.jsonl at the checkpoint and the lines after it."""
    events = EventLog(run_dir / "events.jsonl")
    events.emit("system", 0.0, event="start")
    events.emit("update", 1.0, version=1)
    saver = Checkpoints(run_dir, events, Snapshots(cfg.eval), config_sha(cfg))
    saver.save(1.5, 2, {"ps": "state"})
    at_checkpoint = (run_dir / "events.jsonl").read_bytes()
    events.emit("update", 2.0, version=3)
    events.emit("system", 2.0, event="stop", status="interrupted", reason="SIGTERM")
    events.close()
    after = (run_dir / "events.jsonl").read_bytes()[len(at_checkpoint) :]
    for name in ("summary.json", "metrics.parquet", "model.pt"):
        (run_dir / name).write_text("{}")
    return at_checkpoint, after


def test_resume_rewinds_to_a_checkpoint_of_this_config(tmp_path):
    cfg = compose(fast_with([*SIM, "resume=true"]))
    cfg.run_dir = str(tmp_path)
    at_checkpoint, after = _checkpointed_run(tmp_path, cfg)
    assert at_checkpoint.endswith(b'"event": "checkpoint", "version": 2}\n')
    assert experiment.claim_run_dir(cfg) is None  # the run goes on
    assert (tmp_path / "events.jsonl").read_bytes() == at_checkpoint
    assert (tmp_path / "checkpoint" / "cut-2.jsonl").read_bytes() == after  # kept apart
    assert (tmp_path / "checkpoint" / "state.pt").exists()
    assert not [
        n for n in ("summary.json", "metrics.parquet", "model.pt") if (tmp_path / n).exists()
    ]


def test_an_overwrite_starts_over_and_clears_the_run(tmp_path):
    _checkpointed_run(tmp_path, compose(fast_with([*SIM])))
    cfg = compose(fast_with([*SIM, "overwrite=true"]))
    cfg.run_dir = str(tmp_path)
    assert experiment.claim_run_dir(cfg) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_resume_with_a_checkpoint_of_another_config_starts_over_keeping_the_run_aside(tmp_path):
    _checkpointed_run(tmp_path, compose(fast_with([*SIM])))
    before = _files(tmp_path)
    cfg = compose(fast_with([*SIM, "resume=true", "seed=5"]))
    cfg.run_dir = str(tmp_path)
    assert experiment.claim_run_dir(cfg) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["previous"]
    aside = tmp_path / "previous" / "1"
    assert _files(aside) == before  # events, summary and the rest, byte for byte
    assert (aside / "checkpoint" / "state.pt").exists()
    # a second start-over keeps the first one's files too
    (tmp_path / "events.jsonl").write_text("{}\n")
    assert experiment.claim_run_dir(cfg) is None
    assert sorted(p.name for p in (tmp_path / "previous").iterdir()) == ["1", "2"]
    assert _files(aside) == before


def test_what_a_rank_wrote_after_the_end_is_moved_beside_the_events(tmp_path):
    # a pipeline stage still taking its microbatches when another was lost writes updates
    # after rank 0's `end`: once every rank is down they go to events-after-end.jsonl, and
    # events.jsonl ends with the end, its evaluations and the supervisor's stop
    from stalebench.metrics.events import cut_after_end, read_events

    def line(**event) -> str:
        return json.dumps(event) + "\n"

    path = tmp_path / "events.jsonl"
    earlier = [line(kind="system", t=0.0, event="start"), line(kind="update", t=0.1, version=1),
               line(kind="system", t=0.2, event="end", status="failed"),  # a first attempt
               line(kind="system", t=0.2, event="resume", version=1)]  # fmt: skip
    run = [line(kind="update", t=0.3, version=2),
           line(kind="system", t=0.4, event="end", status="failed"),
           line(kind="update", t=0.45, version=3),  # a stage not yet told
           line(kind="eval", t=0.4, split="test"),
           line(kind="update", t=0.5, version=4),
           line(kind="system", t=0.5, event="stop", status="failed")]  # fmt: skip
    path.write_text("".join(earlier + run))
    assert cut_after_end(path) == 2
    kinds = [(e["kind"], e.get("event"), e.get("version")) for e in read_events(path)]
    assert kinds[-4:] == [("update", None, 2), ("system", "end", None), ("eval", None, None),
                          ("system", "stop", None)]  # fmt: skip
    assert len(kinds) == 8  # the first attempt's end kept, and all before it
    moved = read_events(tmp_path / "events-after-end.jsonl")
    assert [e["version"] for e in moved] == [3, 4]
    assert cut_after_end(path) == 0  # nothing left to move
