"""Bad input on the command line: exit code 2, one line on stderr naming the config key and
the bad value, nothing on stdout, and no process started (no per-rank logs/ anywhere).

Each case is the `stalebench` command in a process of its own: one driver process imports
the CLI (and torch, Hydra and the experiment) once, then forks a child per case that runs
`stalebench.cli.main` with the case's arguments, its working directory and its stdout and
stderr as files, and exits with main's code, as the command would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# (arguments, config key, bad value); "{tmp}" stands for the test's temporary directory.
# A case per way the CLI meets bad input (a group choice, a value, a multirun, a file, the
# model × data check, an engine's check, a sweep): every other refused value is checked in
# process by test_validation_paths.py.
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


IDS = [
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
]

DRIVER = """
import json, os, sys
from stalebench.cli import main
import hydra, torch, stalebench.experiment  # what a run imports: once, not once per case

for case in json.loads(sys.argv[1]):
    pid = os.fork()
    if pid == 0:  # the command, as a process of its own
        os.chdir(case["cwd"])
        os.environ["STALEBENCH_CACHE"] = case["cache"]
        for fd, name in ((1, "stdout"), (2, "stderr")):
            os.dup2(os.open(case[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.argv = ["stalebench", *case["args"]]
        code = 0
        try:
            main()
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else int(done.code is not None)
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    case["code"] = os.waitstatus_to_exitcode(status)
    print(json.dumps(case), flush=True)
"""


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict]:
    """Every case run as the command: its exit code, stdout, stderr and directory."""
    cases = []
    for case_id, (args, _, _) in zip(IDS, CASES, strict=True):
        where = tmp_path_factory.mktemp(case_id)
        out = tmp_path_factory.mktemp(case_id + "-out")
        args = [a.replace("{tmp}", str(where)) for a in args]
        cases.append(dict(id=case_id, cwd=str(where), args=args, cache=str(out / "cache"),
                          stdout=str(out / "stdout"), stderr=str(out / "stderr")))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(cases)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    ran = [json.loads(line) for line in done.stdout.splitlines()]
    return {case["id"]: case for case in ran}


@pytest.mark.parametrize(
    "case_id, args, key, value", [(i, *c) for i, c in zip(IDS, CASES, strict=True)], ids=IDS
)
def test_bad_input_is_one_line_and_exit_2(outcomes, case_id, args, key, value):
    case = outcomes[case_id]
    tmp_path = Path(case["cwd"])
    value = value.replace("{tmp}", str(tmp_path))
    stdout, stderr = (Path(case[k]).read_text() for k in ("stdout", "stderr"))

    assert case["code"] == 2, stderr
    assert stdout == ""
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), stderr
    line = lines[0]
    assert line.startswith("stalebench: error:")
    assert key in line
    assert value in line
    assert not [p for p in tmp_path.rglob("logs") if p.is_dir()], "a process was started"
    assert not list(tmp_path.rglob("events.jsonl"))
    assert not list(tmp_path.rglob("summary.json"))
