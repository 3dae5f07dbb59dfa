"""tests/cli_driver.py's plumbing, on quick commands that import no torch: each command's
exit code, stdout and stderr (into the files it is given), its environment, `sys.path` and
code run first; a command past its time limit killed; a driver that answers batch after
batch; `Command`'s `subprocess.run`-like results and its time limit."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.cli_driver import Command, Driver, case

SAID = "import os, sys; print(os.environ.get('KEPT'), os.environ.get('SET'), file=sys.stderr)"


@pytest.mark.timeout(120)
def test_the_driver_gives_each_command_its_code_output_and_environment(tmp_path):
    env = {**os.environ, "KEPT": "driver"}
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "on_path.py").write_text("NAME = 'found'\n")
    looks = "import on_path, sys; print(on_path.NAME, file=sys.stderr)"
    with Driver(env, imports=()) as driver:  # the plumbing is what is tested
        ran = driver.run(
            [
                case("helped", tmp_path / "a", ["--help"], env={"SET": "a"}, before=SAID),
                case("refused", tmp_path / "b", ["list", "x", "y"], unset=("KEPT",), before=SAID),
                case("slow", tmp_path / "c", ["--help"], before="import time; time.sleep(60)",
                     limit=1),
            ],
            at_once=2,
        )  # fmt: skip
        # the same driver, a second batch: the files the caller names, a path ahead on
        # sys.path, and the directory it runs in
        out = tmp_path / "elsewhere"
        out.mkdir()
        where = "import os, sys; print(os.getcwd(), file=sys.stderr)"
        again = driver.run(
            [
                case("files", tmp_path / "d", ["--help"], stdout=out / "o", stderr=out / "e",
                     before=where),
                case("path", tmp_path / "e", ["list", "x", "y"], path=(str(tmp_path / "lib"),),
                     before=looks),
            ]
        )  # fmt: skip
    helped, refused, slow = ran["helped"], ran["refused"], ran["slow"]
    assert (helped["code"], helped["timed_out"]) == (0, False)
    assert helped["stdout"].startswith("usage: stalebench") and helped["stderr"] == "driver a\n"
    assert refused["code"] == 2 and refused["stdout"] == ""
    assert refused["stderr"] == (
        "None None\nstalebench: error: list takes at most one group, got x y\n"
    )
    assert slow["timed_out"] and slow["code"] == -9 and slow["stdout"] == ""
    assert 1 <= slow["took"] < 30, slow["took"]

    files = again["files"]
    assert files["code"] == 0 and files["stdout"].startswith("usage: stalebench")
    assert (out / "o").read_text() == files["stdout"]
    assert files["stderr"] == f"{tmp_path / 'd'}\n"
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == []  # nothing written there
    assert again["path"]["code"] == 2 and again["path"]["stderr"].startswith("found\n")


@pytest.mark.timeout(120)
def test_commands_are_called_as_subprocess_run_and_killed_after_their_timeout(tmp_path):
    with Command(tmp_path, imports=()) as command:
        done = command(["list", "x", "y"], tmp_path, timeout=60)
        assert isinstance(done, subprocess.CompletedProcess)
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr == "stalebench: error: list takes at most one group, got x y\n"
        assert done.args == ["stalebench", "list", "x", "y"]
        first = command.driver
        helped, listed = command.many(
            [(["--help"], tmp_path), (["list", "x"], tmp_path / "b")], timeout=60, at_once=2
        )
        assert command.driver is first  # one driver for all
        assert helped.returncode == 0 and helped.stdout.startswith("usage: stalebench")
        assert listed.args == ["stalebench", "list", "x"] and listed.returncode == 2
        with pytest.raises(subprocess.TimeoutExpired):
            command(["list"], tmp_path, timeout=0.01)
        assert command.driver is None  # ended with the command it ran
        assert first.process.poll() is not None
        assert command(["--help"], tmp_path, timeout=60).returncode == 0  # a new one
