"""θ snapshots past the latest few go to a file of the run directory and come back when
evaluated (`evaluation.Spill`): memory holds KEEP copies whatever the run's length, the
values come back bit for bit, snapshots that shared a copy share its place, and a run's
events are those of a run that kept every copy in memory."""

from __future__ import annotations

import pytest
import torch

from stalebench import evaluation, experiment
from stalebench.config import EvalConfig
from stalebench.evaluation import KEEP, Snapshots, Spill, Stored
from tests.conftest import compose, fast_with


def in_memory(snaps: Snapshots) -> int:
    """The distinct copies of θ the snapshots hold in memory."""
    return len({id(s.params) for s in snaps.taken if not isinstance(s.params, Stored)})


def test_past_keep_copies_are_spilled_and_come_back_bit_for_bit(tmp_path):
    snaps = Snapshots(EvalConfig(every_s=0.0, every_updates=1), spill=Spill(tmp_path / "s"))
    gen = torch.Generator().manual_seed(0)
    offered = []
    for version in range(40):
        theta = torch.randn(1000, generator=gen)
        offered.append(theta.clone())
        snaps.maybe(0.1 * version, version, theta)
        assert in_memory(snaps) <= KEEP
    assert len(snaps.taken) == 40 and in_memory(snaps) == KEEP
    assert all(torch.equal(s.tensor(), o) for s, o in zip(snaps.taken, offered, strict=True))
    snaps.spill.flush()  # written: read from the file now
    assert all(torch.equal(s.tensor(), o) for s, o in zip(snaps.taken, offered, strict=True))
    assert (tmp_path / "s").stat().st_size == 4 * 1000 * (40 - KEEP)
    snaps.spill.close()
    assert not (tmp_path / "s").exists()


def test_grid_times_that_share_a_copy_share_its_place(tmp_path):
    # the simulator's grid: θ changes every 0.25 s, a snapshot every 0.1 s: two or three grid
    # times hold each version, one copy each, spilled once
    snaps = Snapshots(EvalConfig(every_s=0.1, every_updates=0), on_grid=True,
                      spill=Spill(tmp_path / "s"))  # fmt: skip
    for version in range(30):
        snaps.maybe(0.25 * version, version, torch.full((10,), float(version)))
    snaps.take(7.5, 30, torch.full((10,), 30.0))
    by_version: dict[int, set[int]] = {}
    for s in snaps.taken:
        by_version.setdefault(s.version, set()).add(id(s.params))
        assert torch.equal(s.tensor(), torch.full((10,), float(s.version)))
    assert all(len(places) == 1 for places in by_version.values())
    spilled = {id(s.params) for s in snaps.taken if isinstance(s.params, Stored)}
    assert len(spilled) == 31 - KEEP
    snaps.spill.close()


def test_a_spilled_snapshot_is_checkpointed_with_its_values(tmp_path):
    from stalebench.metrics.events import EventLog
    from stalebench.runtime.checkpoint import Checkpoints

    snaps = Snapshots(EvalConfig(every_s=0.0, every_updates=1), spill=Spill(tmp_path / "s"))
    events = EventLog(tmp_path / "events.jsonl")
    checkpoints = Checkpoints(tmp_path, events, snaps, "sha")
    for version in range(3 * KEEP):
        snaps.maybe(float(version), version, torch.full((5,), float(version)))
    assert isinstance(snaps.taken[0].params, Stored)
    checkpoints.save(1.0, 3 * KEEP, {"x": 1})
    events.close()
    back = Snapshots(EvalConfig(every_s=0.0, every_updates=1))
    saved = {"snapshots": len(snaps.taken), "snapshot_next": (0, 0.0)}
    Checkpoints(tmp_path, EventLog(tmp_path / "e2.jsonl"), back, "sha").resume(saved)
    assert [s.version for s in back.taken] == list(range(3 * KEEP))
    assert all(torch.equal(s.params, torch.full((5,), float(s.version))) for s in back.taken)
    snaps.spill.close()


def eval_lines(run_dir) -> list[str]:
    return [line for line in (run_dir / "events.jsonl").read_text().splitlines()
            if '"eval"' in line]  # fmt: skip


def test_a_runs_events_are_those_of_one_that_kept_every_copy(tmp_path, monkeypatch):
    args = ["runtime=sim", "cluster.num_workers=2", "budget.max_updates=60", "eval.every_updates=2"]
    runs = {}
    for name, keep in (("spilled", KEEP), ("kept", 10**9)):
        monkeypatch.setattr(evaluation, "KEEP", keep)
        cfg = compose(fast_with(args))
        cfg.run_dir = str(tmp_path / name)
        summary = experiment.run(cfg)
        assert summary["status"] == "completed", summary["error"]
        assert not (tmp_path / name / evaluation.SPILL).exists()
        runs[name] = (tmp_path / name / "events.jsonl").read_bytes()
    assert runs["spilled"] == runs["kept"] and len(eval_lines(tmp_path / "kept")) > 4 * KEEP


@pytest.mark.slow
def test_a_real_run_spills_and_is_evaluated(tmp_path):
    args = ["runtime=real", "engine=allreduce", "algorithm=bsp", "cluster.num_workers=2",
            "budget.max_updates=80", "eval.every_updates=2"]  # fmt: skip
    cfg = compose(fast_with(args))
    cfg.run_dir = str(tmp_path)
    summary = experiment.run(cfg)
    assert summary["status"] == "completed", summary["error"]
    assert len(eval_lines(tmp_path)) > 4 * KEEP and not (tmp_path / evaluation.SPILL).exists()


def rss_mb() -> float:
    """The process's resident memory now (Linux)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise OSError("no VmRSS")


def test_memory_holds_a_few_copies_whatever_the_runs_length(tmp_path):
    # 200 snapshots of a 4 MB θ: 800 MB kept in memory; spilled, the process holds about
    # KEEP copies and what the writer has not written yet
    before, peak = rss_mb(), 0.0
    snaps = Snapshots(EvalConfig(every_s=0.0, every_updates=1), spill=Spill(tmp_path / "s"))
    theta = torch.zeros(1 << 20)
    for version in range(200):
        theta.add_(1.0)
        snaps.maybe(float(version), version, theta)
        if version % 20 == 0:
            snaps.spill.flush()  # as a disk keeps up: the bound is on what is held
        peak = max(peak, rss_mb() - before)
    snaps.spill.flush()
    assert peak < 150, peak  # (KEEP + 20 + 1) copies of 4 MB, and the allocator's slack
    assert torch.equal(snaps.taken[17].tensor(), torch.full((1 << 20,), 18.0))
    snaps.spill.close()
