"""The engines without a server checkpoint every rank at once, at a round's end with nothing
in flight (`World.checkpoint`): each rank writes its part, then rank 0 commits the set. An
interrupted run resumed with resume=true ends as the uninterrupted run does: in the
simulator bit for bit (events.jsonl but for its `resume` line, and model.pt), for
engine=local (DiLoCo, streaming DiLoCo with engine.delay=0), engine=allreduce after a
replica was lost (over the replicas left), and gossip and DiLoCo healed by a spare; in real
processes, DiLoCo on 4 replicas stopped by SIGTERM ends with the same θ, bit for bit (its
rounds are synchronous and gloo's ring sums in a fixed order), each round once.

Every run is in this process (`experiment.run`, what the CLI calls: the same events byte
for byte), its ranks forked from one server loaded for every engine: the interrupted one is
signalled as the CLI's top process would be (this process, by a thread watching for its
checkpoint), and ends `interrupted` with the CLI's exit code (SIGINT and SIGTERM through
the CLI itself: tests/integration/test_signals.py); then the uninterrupted run, then the
resumed one."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from stalebench import experiment
from stalebench.errors import ConfigError
from stalebench.metrics.events import read_events, schema_errors
from stalebench.runtime import checkpoint
from stalebench.runtime.signals import Interrupted
from tests.conftest import compose
from tests.speed_helpers import fork_server_for_every_engine

DIE = "cluster.faults=[{worker:2,at_s:0.5,action:die}]"
COMMON = ["cluster.num_workers=4", "dataset=synthetic", "model=mlp", "logger=none"]
# Each run lasts 4.8 simulated seconds (the simulator's real time goes with them, 0.5 s or
# more): two checkpoints or more in the uninterrupted run, the first at 1-2 s, and 3 s or more
# of the run after it for the signal to land in (this process signals itself within tens of
# ms of the checkpoint; the first run of a heterogeneous 4-worker round: 0.6 s for DiLoCo's
# 10 inner steps, 60 ms for a BSP or gossip step). Where a replica is lost (at 0.6 s, the
# end of the round it died in) the first checkpoint comes after that round.
SIM = {
    "diloco": ["algorithm=diloco", "algorithm.outer.inner_steps=10", "budget.max_updates=8",
               "checkpoint_every_s=1"],
    # the inner optimizer's scheduler goes on from its step (it was unpicklable: its
    # function is not data; now kept as its state_dict)
    "diloco-lr-decay": ["algorithm=diloco", "algorithm.outer.inner_steps=10",
                        "budget.max_updates=8", "checkpoint_every_s=1",
                        "algorithm.inner.lr_decay=cosine", "algorithm.inner.lr_decay_steps=400"],
    "streaming-diloco": ["algorithm=streaming_diloco", "engine.delay=0",
                         "algorithm.outer.inner_steps=10", "budget.max_updates=16",
                         "checkpoint_every_s=1"],
    # checkpoints after a replica was lost (it comes back as a spare), and after a spare
    # took a lost worker's place (its part is that worker's)
    "allreduce-lost": ["engine=allreduce", "algorithm=bsp", "budget.max_updates=80",
                       "checkpoint_every_s=1", "cluster.min_replicas=3", DIE],
    # (1.5 s: a checkpoint due in the round that finds the loss, 1.2 s, is not this case's)
    "diloco-healed": ["algorithm=diloco", "algorithm.outer.inner_steps=10",
                      "budget.max_updates=8", "checkpoint_every_s=1.5",
                      "cluster.min_replicas=3", "cluster.spares=1", DIE],
    "gossip-healed": ["algorithm=dpsgd", "budget.max_updates=80", "checkpoint_every_s=1",
                      "cluster.min_replicas=3", "cluster.spares=1", DIE],
}  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def one_fork_server():
    """The real runs here go from engine=local to engine=allreduce: their ranks forked from
    one server (not one started again, torch imported again, at the change of engine)."""
    fork_server_for_every_engine()


def in_process(run_dir: Path, args: list[str]) -> dict:
    """The job the CLI runs on `args`, run here (`experiment.run`): its summary."""
    cfg = compose([*COMMON, *args])
    cfg.run_dir = str(run_dir)
    return experiment.run(cfg)


def committed(run_dir: Path) -> bool:
    return (run_dir / "checkpoint" / "state.pt").exists()


SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_kept() -> Iterator[list[int]]:
    """While inside, SIGINT and SIGTERM that reach this process outside a run (whose
    `interruptible()` takes them while it runs) are kept in the list, not fatal to pytest."""
    kept: list[int] = []
    previous = {s: signal.signal(s, lambda n, _f: kept.append(n)) for s in SIGNALS}
    try:
        yield kept
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


class Interrupter(threading.Thread):
    """Signals this process (the run's top process: the main thread runs the job) once
    `ready(run_dir)`, by default once its first checkpoint set is committed; `error` says
    why it did not. `done` (the run has ended) stops it waiting."""

    def __init__(
        self,
        run_dir: Path,
        sig: signal.Signals,
        ready: Callable[[Path], bool] = committed,
    ):
        super().__init__(daemon=True)
        self.run_dir, self.sig, self.ready = run_dir, sig, ready
        self.done = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        deadline = time.monotonic() + 120
        try:
            while not self.ready(self.run_dir):
                if self.done.is_set():
                    self.error = "it ended before the signal: make it longer"
                    return
                if time.monotonic() > deadline:
                    self.error = "not ready to be signalled in 120 s"
                    return
                time.sleep(0.02)
            os.kill(os.getpid(), self.sig)
        except Exception as exc:  # reported by the test's thread
            self.error = repr(exc)


def interrupted(
    run_dir: Path,
    args: list[str],
    sig: signal.Signals,
    ready: Callable[[Path], bool] = committed,
) -> dict:
    """The job on `args` run here into run_dir, signalled with `sig` once `ready(run_dir)`:
    its summary.json, once it has ended `Interrupted` with the CLI's exit code."""
    watcher = Interrupter(run_dir, sig, ready)
    ended: Interrupted | None = None
    with signals_kept() as late:
        watcher.start()
        try:
            in_process(run_dir, args)
        except Interrupted as exc:
            ended = exc
        finally:
            watcher.done.set()
            watcher.join()
    assert watcher.error is None, watcher.error
    assert not late, f"{late}: the run ended before the signal: make it longer"
    assert ended is not None and ended.exit_code == 128 + sig, ended
    return json.loads((run_dir / "summary.json").read_text())


def interrupted_then_whole(
    tmp_path: Path, args: list[str], sig: signal.Signals
) -> tuple[dict, dict]:
    """The run in tmp_path/run, signalled once its first checkpoint set is committed, then
    the same job uninterrupted into tmp_path/whole: (the interrupted run's summary, the
    uninterrupted run's)."""
    stopped = interrupted(tmp_path / "run", args, sig)
    return stopped, in_process(tmp_path / "whole", args)


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
    stopped, whole = interrupted_then_whole(tmp_path, args, signal.SIGINT)
    assert stopped["status"] == "interrupted"
    assert whole["status"] == "completed", whole["error"]
    summary = in_process(tmp_path / "run", [*args, "resume=true"])
    assert summary["status"] == "completed", summary["error"]
    expected = (tmp_path / "whole" / "events.jsonl").read_text().splitlines()
    assert sum('"event": "checkpoint"' in line for line in expected) >= 2
    if DIE in args:  # every checkpoint after the loss (and the spare's arrival)
        events = [json.loads(line) for line in expected]
        saved = [i for i, e in enumerate(events) if e.get("event") == "checkpoint"]
        worker = [i for i, e in enumerate(events) if e["kind"] == "worker"]
        assert worker and max(worker) < saved[0]
    assert resumed_events(tmp_path / "run") == expected
    assert same_model(tmp_path / "whole", tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sim_a_part_without_its_faults_is_refused_in_the_projects_words(tmp_path):
    # a part written before the world kept each rank's faults (they were the engine's):
    # the resumed run fails naming the rank and the version, not with a KeyError
    args = ["runtime=sim", *SIM["diloco"]]
    assert interrupted(tmp_path / "run", args, signal.SIGINT)["status"] == "interrupted"
    (part,) = (tmp_path / "run" / "checkpoint" / "parts").glob("*/rank-1.pt")
    saved = torch.load(part, weights_only=False)
    saved["part"]["faults"] = saved.pop("faults")  # where the engine kept them
    torch.save(saved, part)
    summary = in_process(tmp_path / "run", [*args, "resume=true"])
    assert summary["status"] == "failed"
    assert "rank 1's part of the checkpoint at version" in summary["error"]
    assert "written by an earlier stalebench" in summary["error"]


# 16 rounds of 5 inner steps, 1.5 s or more (the slowest worker steps 15 ms); stopped after
# the first checkpoint, at about 0.4 s (round 5)
ROUNDS = 16
REAL_DILOCO = ["runtime=real", "algorithm=diloco", "algorithm.outer.inner_steps=5",
               f"budget.max_updates={ROUNDS}", "cluster.compute_ms=5",
               "checkpoint_every_s=0.4", "timeout_s=20"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_real_diloco_stopped_by_sigterm_resumes_to_the_same_theta(tmp_path):
    stopped, whole = interrupted_then_whole(tmp_path, REAL_DILOCO, signal.SIGTERM)
    assert whole["status"] == "completed" and whole["updates"] == ROUNDS, whole["error"]
    run_dir = tmp_path / "run"
    assert stopped["status"] == "interrupted" and stopped["updates"] < ROUNDS
    in_process(run_dir, [*REAL_DILOCO, "resume=true"])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["updates"] == ROUNDS
    events = read_events(run_dir / "events.jsonl")
    assert not [e for e in events if schema_errors(e)]
    (resume,) = [e for e in events if e.get("event") == "resume"]
    assert resume["version"] > 0
    for w in range(4):  # each round once per worker, in order, across the resume
        rounds = [e["version"] for e in events if e["kind"] == "update" and e["worker"] == w]
        assert rounds == list(range(1, ROUNDS + 1))
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
    budget = 120  # 2 s of rounds or more (worker 3 steps 15 ms): stopped at about 1 s at most
    args = ["runtime=real", "engine=allreduce", "algorithm=bsp", f"budget.max_updates={budget}",
            "cluster.compute_ms=5", "checkpoint_every_s=0.5", "timeout_s=20",
            "cluster.min_replicas=3", "cluster.spares=1",
            "cluster.faults=[{worker:2,at_s:0.3,action:die}]"]  # fmt: skip
    run_dir = tmp_path / "run"
    # stopped once a checkpoint after the spare's arrival is committed
    stopped = interrupted(run_dir, args, signal.SIGTERM, ready=_checkpoint_after_replaced)
    assert stopped["status"] == "interrupted" and stopped["updates"] < budget
    in_process(run_dir, [*args, "resume=true"])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["updates"] == budget, summary["error"]
    assert summary["workers_lost"] == [2] and summary["workers_replaced"] == [2]
    events = read_events(run_dir / "events.jsonl")
    (resume,) = [e for e in events if e.get("event") == "resume"]
    for w in range(4):  # each round once per worker (worker 2 missed the one it was lost in)
        rounds = [e["version"] for e in events if e["kind"] == "update" and e["worker"] == w]
        assert rounds == sorted(set(rounds)) and len(rounds) >= budget - 1
        assert [v for v in rounds if v > resume["version"]] == list(
            range(resume["version"] + 1, budget + 1)
        )
    assert "rank 2 of 5" in (run_dir / "logs" / "rank-2.log").read_text()


def _checkpoint_after_replaced(run_dir: Path) -> bool:
    """A checkpoint set after the spare's arrival is committed: its event is written first,
    then the parts, then rank 0's state.pt (written whole, renamed into place)."""
    events = read_events(run_dir / "events.jsonl") if (run_dir / "events.jsonl").exists() else []
    replaced = [i for i, e in enumerate(events) if e.get("event") == "replaced"]
    if not replaced or not committed(run_dir):
        return False
    after = [e["version"] for e in events[replaced[0] :] if e.get("event") == "checkpoint"]
    state = torch.load(run_dir / "checkpoint" / "state.pt", weights_only=False)
    return bool(after) and state["version"] >= after[0]


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
