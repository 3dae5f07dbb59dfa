"""docs/plugins.md is runnable: every ```bash block of it, verbatim, in a fresh virtual
environment where stalebench is installed from a wheel of this checkout."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "plugins.md"
BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)


def bash_blocks() -> list[str]:
    return BLOCK.findall(GUIDE.read_text())


def run(cmd, timeout, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def link_torch(site: Path) -> None:
    """torch (hundreds of MB) comes from this environment by symbolic links; every other
    dependency is installed by pip from the wheel's metadata, so a missing one fails."""
    import torch

    here = Path(torch.__file__).resolve().parents[1]
    for entry in [*here.glob("torch*"), here / "functorch"]:
        if entry.exists():
            (site / entry.name).symlink_to(entry)


@pytest.mark.timeout(300)
def test_every_command_of_the_plugin_guide_runs(tmp_path):
    blocks = bash_blocks()
    assert len(blocks) >= 5, "the guide lost its commands"

    # a fresh environment: stalebench from a wheel of this checkout, with its test extras
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], 60)
    (site,) = (venv / "lib").glob("python*/site-packages")
    link_torch(site)
    wheels = tmp_path / "wheels"
    build = ["pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels)]
    run([sys.executable, "-m", *build, str(ROOT)], 120)  # as the sweeps' wheel test builds it
    (wheel,) = wheels.glob("stalebench-*.whl")
    # nothing of this process's environment may leak in (PYTHONPATH would make pip see a
    # stalebench already "installed", and the commands import it from the source tree)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    env["VIRTUAL_ENV"] = str(venv)
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--no-compile", f"{wheel}[test]"]
    run(pip, 240, cwd=tmp_path, env=env)
    where = run(
        ["python", "-c", "import stalebench; print(stalebench.__file__)"], 60, cwd=tmp_path, env=env
    )
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout

    # what the guide calls "a stalebench checkout": the plugin, the tests, pytest's settings
    checkout = tmp_path / "checkout"
    skip = shutil.ignore_patterns("*.egg-info", "__pycache__", "build", ".cache")
    shutil.copytree(ROOT / "examples" / "plugin", checkout / "examples" / "plugin", ignore=skip)
    shutil.copytree(ROOT / "tests", checkout / "tests", ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", checkout / "pyproject.toml")  # pytest's settings

    times, said = [], []
    for block in blocks:
        start = time.perf_counter()
        said.append(run(["bash", "-euo", "pipefail", "-c", block], 240, cwd=checkout, env=env))
        times.append(round(time.perf_counter() - start, 1))
    print("seconds per block:", times)
    # the guide's check that the plugin is registered shows it
    listed = said[0].stdout
    assert "stalebench list algorithm/update" in blocks[0] and "  signsgd " in listed, listed

    # the plugin's own runs, written by the installed stalebench
    for run_dir in ("runs/signsgd-sim", "runs/signsgd-real"):
        summary = json.loads((checkout / run_dir / "summary.json").read_text())
        assert summary["status"] == "completed", summary["error"]
        assert summary["update_rule"] == "signsgd"
    sweep = [
        json.loads(p.read_text()) for p in (checkout / "runs" / "compare").rglob("summary.json")
    ]
    assert {s["algorithm"] for s in sweep} == {"asp+sgd", "asp+momentum", "asp+signsgd"}
    assert (checkout / "runs" / "compare-report" / "report.md").exists()
    paper = [
        json.loads(p.read_text()) for p in (checkout / "runs" / "ssp-signsgd").rglob("summary.json")
    ]
    assert sorted(s["update_rule"] for s in paper) == ["sgd", "signsgd"]
    assert {s["status"] for s in paper} == {"completed"}
