"""A checkpoint's state.pt read without torch (stalebench.runtime.archive): what torch's
weights-only loader would refuse of it is refused first, in the project's words, and a
resume=true that cannot go on ends before the CLI imports torch."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
from collections import OrderedDict
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from stalebench.errors import BadCheckpoint
from stalebench.registry import STORED, stored
from stalebench.runtime import archive, checkpoint
from stalebench.runtime.archive import Unreadable

SHA = "1111222233334444"


@stored
@dataclass
class Kept:  # a helper a registered part keeps
    steps: int
    buffer: torch.Tensor


class Payload:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def save(obj, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path)
    return path


def test_a_checkpoint_as_a_run_writes_it_is_read_to_its_plain_data(tmp_path):
    state = {
        "config_sha": SHA,
        "t": 1.5,
        "version": 3,
        "theta": torch.arange(6.0),
        "optimizer": OrderedDict(state={0: {"momentum_buffer": torch.ones(2)}}),
        "random": random.Random(7),
        "kept": Kept(4, torch.zeros(3)),
        "ranks": {1, 2},
        "raw": b"\x00\x01",
    }
    path = save(state, tmp_path / "state.pt")
    seen = archive.peek(path)
    assert seen["config_sha"] == SHA and seen["t"] == 1.5 and seen["version"] == 3
    archive.check(path, SHA)  # no refusal
    with torch.serialization.safe_globals([random.Random, *STORED]):
        assert torch.load(path, weights_only=True)["version"] == 3  # torch reads it too


@pytest.mark.parametrize(
    "make, said",
    [
        (lambda p: p.write_bytes(b""), "not loaded: the file is empty"),
        (lambda p: p.write_bytes(random.Random(0).randbytes(512)), "not a torch.save archive"),
        (lambda p: p.write_bytes(b"PK\x03\x04" + bytes(60)), "truncated or corrupt"),
        (lambda p: save(torch.zeros(2), p), "not a stalebench checkpoint (it holds a object"),
        (lambda p: save([SHA], p), "not a stalebench checkpoint (it holds a list, no config_sha"),
        (lambda p: save({"config_sha": "0123456789abcdef"}, p), "from another config: its "
         f"config_sha is 0123456789abcdef, its config.json's {SHA}"),
    ],
    ids=["empty", "random-bytes", "cut-zip", "a-tensor", "a-list", "another-config"],
)  # fmt: skip
def test_what_is_not_a_checkpoint_of_this_config_is_refused_by_name(tmp_path, make, said):
    path = tmp_path / "state.pt"
    make(path)
    with pytest.raises(Unreadable) as refused:
        archive.check(path, SHA)
    assert str(refused.value).startswith(f"{path}: ") and said in str(refused.value)


def test_a_cut_archive_is_refused_as_torchs_loader_refuses_it(tmp_path):
    whole = io.BytesIO()
    torch.save({"config_sha": SHA, "theta": torch.zeros(256)}, whole)
    for cut in (100, 300, len(whole.getvalue()) - 30):
        path = tmp_path / f"cut-{cut}.pt"
        path.write_bytes(whole.getvalue()[:cut])
        with pytest.raises(Unreadable, match="truncated or corrupt"):
            archive.check(path, SHA)
        with pytest.raises(Unreadable):
            checkpoint.read(path)


def test_a_callable_named_in_the_file_is_refused_and_never_called(tmp_path):
    marker = tmp_path / "MARKER"
    path = save({"config_sha": SHA, "state": Payload(marker)}, tmp_path / "state.pt")
    with pytest.raises(Unreadable, match=r"it names posix\.system, which is not data"):
        archive.check(path, SHA)
    assert not marker.exists()


def test_a_standard_library_class_marked_stored_is_data(tmp_path):
    path = save({"config_sha": SHA, "share": Fraction(1, 3)}, tmp_path / "state.pt")
    with pytest.raises(Unreadable, match="fractions.Fraction"):
        archive.check(path, SHA)
    stored(Fraction)
    try:
        archive.check(path, SHA)
    finally:
        STORED.discard(Fraction)


def plant(run_dir: Path, state, config_sha: str = SHA, summary: dict | None = None) -> None:
    folder = run_dir / archive.DIR
    folder.mkdir(parents=True)
    (folder / archive.CONFIG).write_text(json.dumps({"config_sha": config_sha}))
    (folder / "state.pt").write_bytes(state)
    if summary is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary))


def test_refuse_early_refuses_only_what_a_resume_would_go_on_from(tmp_path):
    junk = random.Random(1).randbytes(64)
    plant(tmp_path / "bad", junk)
    with pytest.raises(BadCheckpoint, match=r"not a torch\.save archive\)\. Nothing of the run"):
        archive.refuse_early(tmp_path / "bad", SHA)
    # a checkpoint of another config (its config.json says so) is not gone on from: no refusal
    plant(tmp_path / "other", junk, config_sha="ffff")
    archive.refuse_early(tmp_path / "other", SHA)
    # a run that completed with this config is kept, whatever its checkpoint holds
    plant(tmp_path / "done", junk, summary={"status": "completed", "config_sha": SHA})
    archive.refuse_early(tmp_path / "done", SHA)
    plant(tmp_path / "failed", junk, summary={"status": "failed", "config_sha": SHA})
    with pytest.raises(BadCheckpoint):
        archive.refuse_early(tmp_path / "failed", SHA)
    archive.refuse_early(tmp_path / "empty-dir", SHA)  # nothing there


CLI = """
import sys
from stalebench.cli import main
sys.argv = ["stalebench", *sys.argv[1:]]
try:
    main()
except SystemExit as done:
    print(done.code, "torch" in sys.modules, "mnist1d" in sys.modules)
"""


@pytest.mark.timeout(60)
def test_the_cli_refuses_a_bad_checkpoint_before_it_imports_torch(tmp_path):
    from stalebench.job import config_sha
    from tests.conftest import compose

    args = ["runtime=sim", "dataset=mnist1d", "model=mlp", "resume=true"]
    plant(tmp_path / "run", b"PK\x03\x04" + bytes(60), config_sha=config_sha(compose(args)))
    done = subprocess.run(
        [sys.executable, "-c", CLI, *args, f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=50, cwd=tmp_path,
    )  # fmt: skip
    assert done.stdout.split() == ["2", "False", "False"], done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("stalebench: error: resume=true: ") and "truncated or corrupt" in line
