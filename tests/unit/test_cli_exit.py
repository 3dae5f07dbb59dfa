"""The `stalebench` command's end (`stalebench.cli.script`): main's exit status, then what
the interpreter's exit would have done — threads joined (an idle thread pool's workers
told to stop, not waited on forever), exit handlers run, an event log's buffer and the
standard streams written out — without its teardown of every module."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

# `main` replaced by one that leaves what a run may leave at its end: an event log with a
# buffered line, an exit handler, a thread pool idle, a thread still working, output not
# flushed
PROGRAM = """
import atexit, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import stalebench.cli as cli
from stalebench.metrics.events import EventLog

where = Path(sys.argv[1])

def main():
    log = EventLog(where / "events.jsonl", flush_s=3600)  # nothing written until flushed
    log.emit("system", 0.5, event="start")
    cli.still_open = log  # held to the end, as a module's global would hold it
    atexit.register(lambda: (where / "atexit").write_text("ran"))
    pool = ThreadPoolExecutor(1)
    pool.submit(lambda: None).result()  # its worker now waits for work
    threading.Thread(target=lambda: (time.sleep(0.3), (where / "thread").write_text("done"))
                     ).start()
    sys.stdout.write("no newline")
    {end}

cli.main = main
cli.script()
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("end", "code", "said"),
    [("", 0, ""), ("sys.exit(3)", 3, ""), ("sys.exit('bad things')", 1, "bad things\n")],
)
def test_the_command_ends_as_the_interpreter_would_less_its_teardown(tmp_path, end, code, said):
    program = textwrap.dedent(PROGRAM).replace("{end}", end)
    done = subprocess.run([sys.executable, "-c", program, str(tmp_path)], capture_output=True,
                          text=True, timeout=50)  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (code, "no newline", said)
    (line,) = (tmp_path / "events.jsonl").read_text().splitlines()
    assert json.loads(line) == {"kind": "system", "t": 0.5, "event": "start"}
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "thread").read_text() == "done"  # joined before the end
