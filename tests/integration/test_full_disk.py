"""A disk that fills up mid-run ends it `failed` in one line naming the file it could not
write, with summary.json written in the room the run directory held from its start: on a
small tmpfs (a mount namespace of its own, where the machine allows one), in the simulator
and in real processes; and on any machine, another write error (a file-size limit,
RLIMIT_FSIZE: EFBIG) the same way."""

from __future__ import annotations

import json
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import fast_with

pytestmark = pytest.mark.slow

# long enough that events.jsonl outgrows the disk (a few hundred kB)
RUN = ["dataset=synthetic", "model=mlp", "cluster.num_workers=2", "logger=local",
       "budget.max_wall_s=15", "budget.max_updates=0"]  # fmt: skip


def _namespaces() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--mount", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
        capture_output=True,
    )
    return probe.returncode == 0


def cli(run_dir: Path, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "stalebench.cli", *fast_with(args), f"hydra.run.dir={run_dir}"]


def check_failed_naming(
    run_dir: Path, done: subprocess.CompletedProcess, file: Path, why: str
) -> None:
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert f"{why}: '{file}'" in summary["error"]
    assert "\n" not in summary["error"]
    assert f"error: {summary['error']}" in done.stdout  # the CLI's one line about it
    assert not (run_dir / ".room").exists()


@pytest.mark.skipif(not _namespaces(), reason="no mount namespace here (unshare --mount)")
@pytest.mark.timeout(150)
@pytest.mark.parametrize("runtime", ["sim", "real"])
def test_a_full_disk_ends_the_run_in_one_line_with_its_summary(tmp_path, runtime):
    disk, out = tmp_path / "disk", tmp_path / "out"
    disk.mkdir()
    command = " ".join(f"'{a}'" for a in cli(disk / "run", [*RUN, f"runtime={runtime}"]))
    script = (
        f"mount -t tmpfs -o size=300k tmpfs {disk} && cd {disk} && {command}; rc=$?; "
        f"cp -a {disk}/run {out}; exit $rc"  # the tmpfs goes with the namespace
    )
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    check_failed_naming(out, done, disk / "run" / "events.jsonl", "No space left on device")


def _file_size_limit() -> None:  # in the child: a write past 64 kB fails (EFBIG)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))


@pytest.mark.timeout(120)
def test_a_write_error_ends_a_simulated_run_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    done = subprocess.run(
        cli(run_dir, [*RUN, "runtime=sim"]),
        cwd=tmp_path, capture_output=True, text=True, timeout=100,
        preexec_fn=_file_size_limit,
    )  # fmt: skip
    check_failed_naming(run_dir, done, run_dir / "events.jsonl", "File too large")
