"""A run directory is data, never code. A checkpoint file that names code to run (a pickle
whose payload would create a marker file) is refused by name on resume=true — state.pt, a
rank's part, a θ snapshot — before anything of the run directory changes, and the marker
never appears: in process, through the CLI (the issue's `stalebench runtime=sim
resume=true hydra.run.dir=<dir>`), and in a sweep rerun, whose sweeper adds resume=true to
every unfinished job. A checkpoint that cannot be read (truncated) keeps the run's history:
an error naming the file, or with resume_unreadable=restart a fresh start with the old
files moved aside. What is wrong with a file is said in the project's words (not a
stalebench checkpoint, truncated, from another config), never with torch's advice to load
it unsafely. The state ranks hand a spare is read the same way."""

from __future__ import annotations

import io
import json
import random
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from stalebench import experiment
from stalebench.algorithms import UPDATES
from stalebench.errors import ConfigError
from stalebench.job import config_sha
from stalebench.runtime import checkpoint
from tests.conftest import compose, fast_with, preset_engines

# a sim run whose checkpoint is a set of rank parts, with θ snapshots beside it
ARGS = ["runtime=sim", "engine=allreduce", "algorithm=bsp", "cluster.num_workers=2",
        "budget.max_updates=40", "checkpoint_every_s=0.05", "logger=none"]  # fmt: skip


class Payload:
    """Unpickled by a loader that runs what a file names, it creates `marker`."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def plant(path: Path, marker: Path) -> None:
    """Replace a checkpoint file by one that holds the payload where its data was."""
    torch.save({"state": Payload(marker), "config_sha": "x"}, path)


def files(run_dir: Path) -> dict[str, bytes]:
    """The run's files (the checkpoint's apart; Hydra's own, which the CLI writes, apart)."""
    return {
        str(p.relative_to(run_dir)): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and not {"checkpoint", ".hydra", "cli.log"} & set(p.parts)
    }


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A completed run with its last checkpoint set on disk."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    cfg = compose(fast_with(ARGS))
    cfg.run_dir = str(run_dir)
    assert experiment.run(cfg)["status"] == "completed"
    return run_dir


def stopped_copy(finished: Path, tmp_path: Path) -> Path:
    """The finished run as a stopped one: no summary.json, so resume=true goes on from its
    checkpoint rather than keeping it."""
    run_dir = tmp_path / "run"
    subprocess.run(["cp", "-a", str(finished), str(run_dir)], check=True)
    (run_dir / "summary.json").unlink()
    return run_dir


def target(run_dir: Path, which: str) -> Path:
    folder = run_dir / "checkpoint"
    if which == "state":
        return folder / "state.pt"
    if which == "snapshot":
        return folder / "snap-00000.pt"
    (part,) = folder.glob("parts/*/rank-1.pt")
    return part


def resumed(run_dir: Path, *extra: str):
    cfg = compose(fast_with([*ARGS, "resume=true", *extra]))
    cfg.run_dir = str(run_dir)
    return cfg


@pytest.mark.parametrize("which", ["state", "part", "snapshot"])
def test_a_planted_payload_is_refused_by_name_and_never_runs(finished, tmp_path, which):
    run_dir = stopped_copy(finished, tmp_path)
    marker = tmp_path / "MARKER"
    path = target(run_dir, which)
    plant(path, marker)
    before = files(run_dir)
    with pytest.raises(experiment.BadCheckpoint) as refused:
        experiment.run(resumed(run_dir))
    message = str(refused.value)
    assert str(path) in message and "\n" not in message
    assert re.search(r": not loaded: it names \S*open, which is not data a checkpoint may", message)
    assert not marker.exists()
    assert files(run_dir) == before  # history kept, nothing rewound


def test_a_truncated_checkpoint_keeps_the_history_or_moves_it_aside(finished, tmp_path):
    run_dir = stopped_copy(finished, tmp_path)
    state = target(run_dir, "state")
    state.write_bytes(state.read_bytes()[:200])
    before = files(run_dir)
    with pytest.raises(experiment.BadCheckpoint, match="truncated or corrupt"):
        experiment.claim_run_dir(resumed(run_dir))
    assert files(run_dir) == before
    # asked for explicitly: a fresh start, the old run moved aside whole
    assert experiment.claim_run_dir(resumed(run_dir, "resume_unreadable=restart")) is None
    aside = run_dir / "previous" / "1"
    assert files(aside) == before and (aside / "checkpoint" / "state.pt").exists()
    assert sorted(p.name for p in run_dir.iterdir()) == ["previous"]


def test_the_config_is_checked_before_any_state_is_read(finished, tmp_path):
    """A checkpoint of another config (config.json says so) is not read at all: its run is
    moved aside and the new one starts over."""
    run_dir = stopped_copy(finished, tmp_path)
    marker = tmp_path / "MARKER"
    plant(target(run_dir, "state"), marker)
    cfg = resumed(run_dir, "seed=7")
    assert checkpoint.config_of(run_dir) != config_sha(cfg)
    assert experiment.claim_run_dir(cfg) is None
    assert not marker.exists()
    assert (run_dir / "previous" / "1" / "events.jsonl").exists()


def _zip_of_text() -> bytes:
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w") as z:
        z.writestr("notes.txt", "not a checkpoint")
    return data.getvalue()


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (lambda: random.Random(0).randbytes(4096), "not a stalebench checkpoint (not a torch.save "
         "archive)"),
        (lambda: bytes(1024), "not a stalebench checkpoint (not a torch.save archive)"),
        (lambda: b"", "the file is empty"),
        (_zip_of_text, "not a stalebench checkpoint (a torch.save archive the weights-only "
         "loader cannot read)"),
    ],
    ids=["random-bytes", "zeros", "empty", "another-zip"],
)  # fmt: skip
def test_a_file_that_is_no_checkpoint_is_refused_in_the_projects_words(tmp_path, content, why):
    """What torch says of such a file is not relayed: it advises loading it with
    weights_only=False, which would run whatever a file of unknown origin names."""
    path = tmp_path / "state.pt"
    path.write_bytes(content())
    for source, name in ((path, str(path)), (io.BytesIO(content()), "the state rank 0 sent")):
        with pytest.raises(checkpoint.Unreadable) as refused:
            checkpoint.read(source, name)
        assert str(refused.value).startswith(f"{name}: not loaded: {why}")
        assert "weights_only" not in str(refused.value)


def test_a_state_of_another_config_or_of_no_run_is_named_as_such(tmp_path):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"config_sha": "a" * 16}))
    state = folder / "state.pt"
    torch.save({"config_sha": "b" * 16, "t": 0.0}, state)
    with pytest.raises(checkpoint.Unreadable) as refused:
        checkpoint.load(tmp_path, "a" * 16)
    assert str(refused.value) == (
        f"{state}: from another config: its config_sha is {'b' * 16}, its config.json's {'a' * 16}"
    )
    torch.save(torch.ones(3), state)
    with pytest.raises(checkpoint.Unreadable, match=r"state.pt: not a stalebench checkpoint \("):
        checkpoint.load(tmp_path, "a" * 16)


def test_the_state_handed_to_a_spare_is_read_safely(tmp_path):
    marker = tmp_path / "MARKER"
    sent = io.BytesIO()
    torch.save({"theta": torch.ones(3), "x": Payload(marker)}, sent)
    with pytest.raises(checkpoint.Unreadable, match="^the state rank 0 sent: not loaded"):
        checkpoint.read(io.BytesIO(sent.getvalue()), "the state rank 0 sent")
    assert not marker.exists()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_cli_refuses_a_planted_state_in_one_line(finished, tmp_path):
    run_dir = stopped_copy(finished, tmp_path)
    marker = tmp_path / "MARKER"
    path = target(run_dir, "state")
    plant(path, marker)
    (run_dir / "checkpoint" / "config.json").write_text(
        json.dumps({"config_sha": config_sha(resumed(run_dir))})
    )
    before = files(run_dir)
    done = subprocess.run(
        [sys.executable, "-m", "stalebench.cli", *fast_with(ARGS), "resume=true",
         f"hydra.run.dir={run_dir}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert done.returncode != 0
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("stalebench: error: resume=true: ") and str(path) in line
    assert not marker.exists()
    assert files(run_dir) == before


# every algorithm whose ranks keep parts (engine=local and gossip presets, each update rule
# on engine=allreduce, the inner optimizers): its checkpoint reads back whole under the
# safe loader (a helper class not marked `stored` fails here)
KEEPS_PARTS = (
    [[f"algorithm={p}"] for p, e in sorted(preset_engines().items()) if e in ("local", "gossip")]
    + [["algorithm=diloco", "algorithm/inner=momentum"], ["algorithm=streaming_diloco",
       "engine.delay=0", "algorithm.inner.lr_decay=inverse_sqrt",
       "algorithm.inner.lr_decay_steps=100"]]
    + [["engine=allreduce", "algorithm=bsp", f"algorithm/update={u}"] for u in UPDATES.names()]
)  # fmt: skip


@pytest.mark.timeout(60)
@pytest.mark.parametrize("choice", KEEPS_PARTS, ids=" ".join)
def test_every_checkpoint_a_run_keeps_reads_back_safely(tmp_path, choice):
    args = ["runtime=sim", "cluster.num_workers=3", "budget.max_updates=60", "logger=none"]
    try:
        cfg = compose(fast_with([*args, "checkpoint_every_s=0.05", *choice]))
        cfg.run_dir = str(tmp_path)
        summary = experiment.run(cfg)
    except ConfigError as refused:  # keeps none (messages in flight) or takes no round mean
        why = ("keeps none", "always in flight", "cannot take a round's averaged gradient")
        if not any(w in str(refused) for w in why):
            raise
        pytest.skip(f"refused by name: {refused}")
    assert summary["status"] == "completed"
    saved = checkpoint.load(tmp_path, config_sha(cfg))
    assert saved is not None and saved["version"] > 0
    checkpoint.verify(tmp_path, saved)  # every part and snapshot of the set
