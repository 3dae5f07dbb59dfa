"""Bad input on the command line: exit code 2, one line on stderr naming the config key and
the bad value, nothing on stdout, and no process started (no per-rank logs/ anywhere)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# (arguments, config key, bad value); "{tmp}" stands for the test's temporary directory.
# A case per way the CLI meets bad input (a group choice, a value, a multirun, a file, the
# model × data check, an engine's check, a sweep), each a process start of a few seconds:
# every other refused value is checked in process by test_validation_paths.py.
CASES = [
    (["algorithm=foo"], "algorithm", "foo"),
    (["algorithm.barrier.staleness=-1"], "algorithm.barrier.staleness", "-1"),
    (["dataset=mnist", "dataset.root={tmp}/nope"], "dataset.root", "{tmp}/nope"),
    (["-m", "algorithm=bsp,nope"], "algorithm", "nope"),
    (["algorithm=nesterov_pp", "algorithm.pipeline.stages=8"], "algorithm.pipeline.stages", "8"),
    (["algorithm=pipedream", "dataset.path={tmp}/nope.txt"], "dataset.path", "{tmp}/nope.txt"),
    (["algorithm=nesterov_pp", "engine=ps"], "engine", "ps"),
    (["algorithm/optimizer=foo"], "algorithm/optimizer", "foo"),
    (["model=resnet20"], "model=resnet20", "(40,)"),
    (["dataset=cifar10", "dataset.root={tmp}/nope"], "dataset.root", "{tmp}/nope"),
    (["-m", "+sweep=nope"], "sweep", "nope"),
    (["+sweep=dssp", "sweep.scale=huge"], "sweep.scale", "huge"),
]


@pytest.mark.parametrize(
    "args, key, value",
    CASES,
    ids=[
        "unknown-algorithm",
        "negative-staleness",
        "missing-mnist-root",
        "multirun-unknown-algorithm",
        "pipeline-more-stages-than-layers",
        "missing-text-file",
        "pipeline-algorithm-on-ps",
        "unknown-optimizer",
        "model-that-cannot-read-the-inputs",
        "missing-cifar-root",
        "unknown-sweep",
        "bad-sweep-scale",
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, key, value):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    value = value.replace("{tmp}", str(tmp_path))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["STALEBENCH_CACHE"] = str(tmp_path / "cache")
    proc = subprocess.run(
        [sys.executable, "-m", "stalebench.cli", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), proc.stderr
    line = lines[0]
    assert line.startswith("stalebench: error:")
    assert key in line
    assert value in line
    assert not [p for p in tmp_path.rglob("logs") if p.is_dir()], "a process was started"
    assert not list(tmp_path.rglob("events.jsonl"))
    assert not list(tmp_path.rglob("summary.json"))
