"""A disk that fills up mid-run ends it `failed` in one line naming the file it could not
write, with summary.json written in the room the run directory held from its start: on a
small tmpfs (a mount namespace of its own, where the machine allows one), in the simulator
and in real processes; and on any machine, another write error (a file-size limit,
RLIMIT_FSIZE: EFBIG) the same way. A disk full before the run starts (or a limit no file
may grow past) is refused in one line naming the directory, exit 2, before Hydra writes
there."""

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


# a disk full before the run starts: refused in one line naming the directory, exit 2,
# before Hydra writes its config files there and before torch is imported
AT_START = [sys.executable, "-c", """
import sys
from stalebench.cli import main
sys.argv = ["stalebench", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    print("exit", exc.code, "torch" in sys.modules)
"""]  # fmt: skip


def check_refused_at_start(done: subprocess.CompletedProcess, run_dir: Path, where: Path):
    assert done.stdout.split() == ["exit", "2", "False"], done.stdout + done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"stalebench: error: hydra.run.dir={run_dir}: "), line
    assert str(where) in line
    assert not run_dir.exists()


@pytest.mark.timeout(60)
def test_a_run_dir_that_cannot_be_written_at_start_is_refused_in_one_line(tmp_path):
    run_dir = tmp_path / "run"

    def no_file_may_grow() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    done = subprocess.run(
        [*AT_START, *RUN, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=50, preexec_fn=no_file_may_grow,
    )  # fmt: skip
    check_refused_at_start(done, run_dir, tmp_path)
    assert "File too large" in done.stderr


@pytest.mark.skipif(not _namespaces(), reason="no mount namespace here (unshare --mount)")
@pytest.mark.timeout(60)
def test_a_disk_full_at_start_is_refused_in_one_line_naming_it(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    command = " ".join(f"'{a}'" for a in [*AT_START, *RUN, f"hydra.run.dir={disk}/run"])
    script = (
        f"mount -t tmpfs -o size=64k tmpfs {disk} && cd {disk} && "
        f"(cat /dev/zero > {disk}/fill 2>/dev/null; {command})"
    )
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=50
    )
    check_refused_at_start(done, disk / "run", disk)
    assert "the disk is full" in done.stderr
