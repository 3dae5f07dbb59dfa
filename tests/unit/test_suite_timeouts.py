"""A test past its timeout fails and the suite goes on to its end: the suite's own pytest
settings (`addopts`, `timeout_method` from pyproject.toml) run on a small suite of files,
one of whose tests sleeps past a 3 s timeout. With the thread method the worker is ended
and pytest-xdist's per-file scheduling waits forever (pytest-dev/pytest-xdist#1378)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(150)
def test_a_timed_out_test_fails_and_every_other_test_runs(tmp_path: Path) -> None:
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    (tmp_path / "pytest.ini").write_text(
        f"[pytest]\naddopts = {ini['addopts']}\ntimeout = 3\n"
        f"timeout_method = {ini['timeout_method']}\n"
    )
    for i in range(6):
        (tmp_path / f"test_f{i}.py").write_text(
            "import time\n"
            + ("def test_slow():\n    time.sleep(60)\n" if i == 2 else "")
            + "".join(f"def test_{k}():\n    time.sleep(0.2)\n" for k in range(3))
        )
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the suite hung after a timeout: {(e.stdout or b'')[-2000:]!r}")
    tail = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 1, done.stdout[-3000:]
    assert "1 failed, 18 passed" in tail, done.stdout[-3000:]
