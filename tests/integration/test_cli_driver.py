"""`drive`: several `stalebench` commands run by one driver process, as
tests/unit/test_cli_errors.py's DRIVER runs its cases. The driver imports the CLI (and
torch, Hydra and the experiment) once, then forks a child per case: the child takes the
case's working directory, environment and `sys.path`, writes its stdout and stderr to
files, runs `stalebench.cli.main` with the case's arguments, runs the exit handlers a
process runs at its end (W&B's teardown among them) and exits with main's code, as the
command would. A case past its time limit is killed, as `subprocess.run(timeout=)` kills
it. The test below checks the driver's plumbing on two quick cases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DRIVER = """
import atexit, importlib, json, os, signal, sys, time
from stalebench.cli import main

cases, at_once = json.loads(sys.argv[1]), int(sys.argv[2])
for name in sys.argv[3:]:  # what a run imports: once, not once per case
    importlib.import_module(name)
assert "wandb" not in sys.modules  # each case imports its own (or a broken one)


def child(case):
    os.chdir(case["cwd"])
    for key in case["unset"]:
        os.environ.pop(key, None)
    os.environ.update(case["env"])
    sys.path[:0] = case["path"]
    for fd, name in ((1, "stdout"), (2, "stderr")):
        os.dup2(os.open(case[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.argv = ["stalebench", *case["args"]]
    code = 0
    try:
        if case["before"]:
            exec(case["before"], {"__name__": "__case__"})
        main()
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else int(done.code is not None)
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()  # what the interpreter runs at a process's end
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


pending, running = list(cases), {}
while pending or running:
    while pending and len(running) < at_once:
        case = pending.pop(0)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            child(case)
        running[pid] = (case, time.monotonic())
    pid, status = os.waitpid(-1, os.WNOHANG)
    if pid:
        case, start = running.pop(pid)
        case["took"] = time.monotonic() - start
        case["code"] = os.waitstatus_to_exitcode(status)
        print(json.dumps(case), flush=True)
        continue
    for pid, (case, start) in running.items():
        if time.monotonic() - start > case["limit"] and not case.get("timed_out"):
            case["timed_out"] = True
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.05)
"""


def case(
    case_id: str,
    cwd: Path,
    args: list[str],
    *,
    env: dict[str, str] | None = None,
    unset: tuple[str, ...] = (),
    path: tuple[str, ...] = (),
    before: str = "",
    limit: float = 150,
) -> dict:
    """A command for `drive`: `stalebench args` in `cwd`, its environment changed by `env`
    and `unset`, `path` ahead on sys.path (as PYTHONPATH would put it), the Python code
    `before` run in its process first; killed after `limit` seconds."""
    cwd.mkdir(parents=True, exist_ok=True)
    out = {name: str(cwd / f".{case_id}.{name}") for name in ("stdout", "stderr")}
    return dict(id=case_id, cwd=str(cwd), args=args, env=env or {}, unset=list(unset),
                path=list(path), before=before, limit=limit, **out)  # fmt: skip


# what the driver imports before its first fork: what a run imports
RUN_IMPORTS = ("hydra", "torch", "stalebench.experiment")


def drive(
    cases: list[dict], env: dict[str, str], at_once: int = 1, imports=RUN_IMPORTS
) -> dict[str, dict]:
    """Run `cases` (`case`), `at_once` at a time, in one driver process with environment
    `env` that imports `imports` first; per case id: the case with its exit `code`,
    `stdout`, `stderr` (their text), `took` (seconds) and `timed_out`."""
    budget = sum(c["limit"] for c in cases) / at_once + 60
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(cases), str(at_once), *imports],
        env=env, capture_output=True, text=True, timeout=budget,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    ran = [json.loads(line) for line in done.stdout.splitlines()]
    assert sorted(c["id"] for c in ran) == sorted(c["id"] for c in cases), done.stdout
    for c in ran:
        c["stdout"], c["stderr"] = (Path(c[k]).read_text() for k in ("stdout", "stderr"))
        c.setdefault("timed_out", False)
    return {c["id"]: c for c in ran}


@pytest.mark.timeout(120)
def test_the_driver_gives_each_command_its_code_output_and_environment(tmp_path):
    env = {**os.environ, "KEPT": "driver"}
    said = "import os, sys; print(os.environ.get('KEPT'), os.environ.get('SET'), file=sys.stderr)"
    ran = drive(
        [
            case("helped", tmp_path / "a", ["--help"], env={"SET": "a"}, before=said),
            case("refused", tmp_path / "b", ["list", "x", "y"], unset=("KEPT",), before=said),
        ],
        env,
        at_once=2,
        imports=(),  # these two import no torch: the plumbing is what is tested
    )
    helped, refused = ran["helped"], ran["refused"]
    assert (helped["code"], helped["timed_out"]) == (0, False)
    assert helped["stdout"].startswith("usage: stalebench") and helped["stderr"] == "driver a\n"
    assert refused["code"] == 2 and refused["stdout"] == ""
    assert refused["stderr"] == (
        "None None\nstalebench: error: list takes at most one group, got x y\n"
    )
