"""`stalebench` commands as processes of their own, forked by one driver process that
imported the CLI (and torch, Hydra, the experiment: what a run imports) once, instead of
one interpreter started per command.

The driver reads batches of commands (`case`) on its stdin. It runs a batch `at_once` at a
time: each command is a child forked from the driver that takes the case's working
directory, environment and `sys.path`, reads nothing on stdin, writes its stdout and stderr
to files, runs `stalebench.cli.main` with the case's arguments and exits with main's code
as the installed `stalebench` script would, its threads joined and its exit handlers run
as the interpreter runs them at its exit (W&B's teardown, a launcher's workers shut down).
A command past its time limit is killed, as `subprocess.run(timeout=)` kills it. The
driver answers each finished command with a line: its exit code, its seconds, whether it
was killed.

`drive` runs one batch in a driver of its own; `Driver` keeps one for several batches (a
module's commands, between which its tests read and change the directories); `Command` is
a `Driver` called like `subprocess.run`. tests/integration/test_cli_driver.py checks the
plumbing."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DRIVER = r"""
import importlib, json, os, select, signal, sys, time
from stalebench.cli import end, script

setup = json.loads(sys.argv[1])
for name in setup["imports"]:  # what a command imports: once, not once per command
    importlib.import_module(name)
for name in setup["absent"]:  # each command imports its own (or a broken one)
    assert name not in sys.modules, f"the driver imported {name}"


def child(case):
    os.chdir(case["cwd"])
    for key in case["unset"]:
        os.environ.pop(key, None)
    os.environ.update(case["env"])
    sys.path[:0] = case["path"]
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        os.dup2(os.open(case[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.argv = ["stalebench", *case["args"]]
    try:
        if case["before"]:
            exec(case["before"], {"__name__": "__case__"})
        script()  # ends the process, unless an exception other than SystemExit escapes
    except BaseException:  # as the interpreter ends on one: its traceback, exit 1
        import traceback
        traceback.print_exc()
    end(1)


def run(cases, at_once):
    pending, running = list(cases), {}  # pid -> (case, start, pidfd)
    while pending or running:
        while pending and len(running) < at_once:
            case = pending.pop(0)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                child(case)
            running[pid] = (case, time.monotonic(), os.pidfd_open(pid))
        now = time.monotonic()
        for pid, (case, start, _) in running.items():
            if now - start > case["limit"] and not case.get("timed_out"):
                case["timed_out"] = True
                os.kill(pid, signal.SIGKILL)
        left = [c["limit"] - (now - s) for c, s, _ in running.values() if not c.get("timed_out")]
        fds = {fd: pid for pid, (_, _, fd) in running.items()}
        ready, _, _ = select.select(list(fds), [], [], max(0.0, min(left, default=1.0)))
        for fd in ready:
            pid = fds[fd]
            _, status = os.waitpid(pid, 0)
            case, start, _ = running.pop(pid)
            os.close(fd)
            case["took"] = time.monotonic() - start
            case["code"] = os.waitstatus_to_exitcode(status)
            print(json.dumps(case), flush=True)


for line in sys.stdin:
    batch = json.loads(line)
    run(batch["cases"], batch["at_once"])
    print(json.dumps({"done": True}), flush=True)
"""

# what a driver imports before its first fork by default: what a run imports (torch._dynamo:
# torch.func's transforms, which the simulator's gradients use, import it at their first
# call, ~2 s; pandas: the metrics table's writer)
RUN_IMPORTS = ("hydra", "torch", "torch._dynamo", "pandas", "stalebench.experiment")
# and what a multirun imports at its end: the sweep's report
SWEEP_IMPORTS = (*RUN_IMPORTS, "stalebench.callbacks", "stalebench.report.cli",
                 "stalebench.report.figures")  # fmt: skip


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
    stdout: Path | None = None,
    stderr: Path | None = None,
) -> dict:
    """A command: `stalebench args` in `cwd`, its environment changed by `env` and `unset`,
    `path` ahead on sys.path (as PYTHONPATH would put it), the Python code `before` run in
    its process first; killed after `limit` seconds. Its stdout and stderr go to the files
    `stdout` and `stderr`, by default `.<case_id>.stdout` and `.stderr` in `cwd`."""
    cwd.mkdir(parents=True, exist_ok=True)
    out = {
        name: str(given if given is not None else cwd / f".{case_id}.{name}")
        for name, given in (("stdout", stdout), ("stderr", stderr))
    }
    return dict(id=case_id, cwd=str(cwd), args=list(args), env=env or {}, unset=list(unset),
                path=list(path), before=before, limit=limit, **out)  # fmt: skip


class Driver:
    """One driver process, in `cwd` with environment `env` (this process's by default), that
    imports `imports` and asserts that none of `absent` was imported with them; `run` hands
    it a batch of commands. Closing it (or leaving its `with` block) ends it and every process
    of its session: a command cut short leaves nothing behind."""

    def __init__(
        self,
        env: dict[str, str] | None = None,
        imports: tuple[str, ...] = RUN_IMPORTS,
        absent: tuple[str, ...] = ("wandb",),
        cwd: Path | None = None,
    ):
        self.log = tempfile.TemporaryFile("w+")  # the driver's own errors
        setup = json.dumps({"imports": list(imports), "absent": list(absent)})
        self.process = subprocess.Popen(
            [sys.executable, "-c", DRIVER, setup],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=os.environ if env is None else env,
            cwd=cwd,
            start_new_session=True,  # its commands in its session: ended with it
        )
        self.pending = b""

    def run(self, cases: list[dict], at_once: int = 1) -> dict[str, dict]:
        """Runs `cases`, `at_once` at a time; per case id: the case with its exit `code`,
        `stdout` and `stderr` (their text), `took` (seconds) and `timed_out`."""
        budget = sum(c["limit"] for c in cases) / at_once + 60
        deadline = time.monotonic() + budget
        ran = []
        try:
            batch = json.dumps({"cases": cases, "at_once": at_once}) + "\n"
            self.process.stdin.write(batch.encode())
            self.process.stdin.flush()
            while (answer := self._answer(deadline)) != {"done": True}:
                ran.append(answer)
        except BaseException:  # cut short (pytest's timeout too): no driver left
            self.close()
            raise
        assert sorted(c["id"] for c in ran) == sorted(c["id"] for c in cases), ran
        for c in ran:
            c["stdout"], c["stderr"] = (Path(c[k]).read_text() for k in ("stdout", "stderr"))
            c.setdefault("timed_out", False)
        return {c["id"]: c for c in ran}

    def _answer(self, deadline: float) -> dict:
        fd = self.process.stdout.fileno()
        while b"\n" not in self.pending:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError("the driver did not answer in time")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self.log.seek(0)
                raise AssertionError(f"the driver ended: {self.log.read()[-3000:]}")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):  # what its commands left too
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            stream.close()
        self.log.close()

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def drive(
    cases: list[dict],
    env: dict[str, str] | None = None,
    at_once: int = 1,
    imports: tuple[str, ...] = RUN_IMPORTS,
) -> dict[str, dict]:
    """`cases` run `at_once` at a time by a driver of their own (`Driver.run`)."""
    with Driver(env, imports) as driver:
        return driver.run(cases, at_once)


class Command:
    """`stalebench ARGS` in a directory, called as `subprocess.run` would run it (`many`:
    several, some at once): a command forked by a driver (started at the first command, and
    again after a command that did not end in its time, which ends the driver), whose stdout
    and stderr are kept in `where`."""

    def __init__(self, where: Path, env: dict[str, str] | None = None, imports=RUN_IMPORTS):
        self.where, self.env, self.imports = where, env, imports
        self.driver: Driver | None = None
        self.count = 0

    def __call__(self, args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
        return self.many([(args, cwd)], timeout)[0]

    def many(
        self, commands: list[tuple[list[str], Path]], timeout: float, at_once: int = 1
    ) -> list[subprocess.CompletedProcess]:
        """Each of `commands` (arguments, directory), `at_once` at a time."""
        if self.driver is None:
            self.driver = Driver(self.env, self.imports, cwd=self.where)
        cases = []
        for args, cwd in commands:
            self.count += 1
            out = {k: self.where / f"{self.count}.{k}" for k in ("stdout", "stderr")}
            cases.append(case(str(self.count), cwd, args, limit=timeout, **out))
        ran = self.driver.run(cases, at_once)
        done = [ran[c["id"]] for c in cases]
        for d in done:
            if d["timed_out"]:
                self.close()
                raise subprocess.TimeoutExpired(["stalebench", *d["args"]], timeout)
        return [
            subprocess.CompletedProcess(
                ["stalebench", *d["args"]], d["code"], d["stdout"], d["stderr"]
            )
            for d in done
        ]

    def close(self) -> None:
        """Ends the driver at once (with the command it runs, if one is running)."""
        if self.driver is not None:
            self.driver.close()
            self.driver = None

    def __enter__(self) -> Command:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
