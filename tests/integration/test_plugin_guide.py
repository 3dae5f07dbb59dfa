"""docs/plugins.md is runnable: every ```bash block of it, verbatim, in a fresh virtual
environment where stalebench is installed from a wheel of this checkout. Its dependencies
are this environment's releases, linked into the venv: exactly those the wheel's metadata
requires (with its test extras), so that a dependency it fails to declare is missing there,
and pip, installing the wheel from no index, refuses it unless every one is met."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from email.parser import Parser
from importlib.metadata import Distribution, distribution, distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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


def dependencies(wheel: Path, extras: tuple[str, ...]) -> dict[str, Distribution]:
    """What `pip install WHEEL[EXTRAS]` needs, as pip resolves it: the wheel's requirements
    with those extras, theirs, and so on (markers evaluated), each met by this environment's
    distribution of that name (a requirement it does not meet fails here)."""
    with zipfile.ZipFile(wheel) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        wanted = Parser().parsestr(z.read(meta).decode()).get_all("Requires-Dist") or []
    found: dict[str, Distribution] = {}
    extras_of: dict[str, set[str]] = {}
    todo = [(Requirement(r), {"", *extras}) for r in wanted]
    while todo:
        req, on = todo.pop()
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in on):
            continue
        name, need = canonicalize_name(req.name), {"", *req.extras}
        dist = distribution(req.name)
        assert req.specifier.contains(dist.version, prereleases=True), (req, dist.version)
        if name in found and need <= extras_of[name]:
            continue
        found[name], extras_of[name] = dist, extras_of.get(name, set()) | need
        todo += [(Requirement(r), extras_of[name]) for r in dist.requires or []]
    return found


def link(dists: list[Distribution], venv: Path, site: Path, keep: set[str]) -> None:
    """`dists` put into `venv` as pip would have installed them (their RECORD: site-packages,
    scripts), by symbolic links to this environment's files: a folder whole where it is
    one distribution's alone and not in `keep` (a namespace the wheel installs into), else
    file by file; a script is copied, naming the venv's python instead of this one's."""
    owners: dict[str, set[str]] = {}
    for dist in distributions():
        name = canonicalize_name(dist.metadata["Name"])
        for f in dist.files or []:
            owners.setdefault(Path(os.path.normpath(f)).parts[0], set()).add(name)
    here = str(Path(sys.executable).parent).encode()  # this environment's scripts' folder
    for dist in dists:
        name, base = canonicalize_name(dist.metadata["Name"]), Path(dist.locate_file(""))
        assert dist.files is not None, f"{name}: no RECORD to install it from"
        for f in dist.files:
            rel = Path(os.path.normpath(f))
            top = rel.parts[0]
            if owners[top] == {name} and top not in keep and (base / top).is_dir():
                if not (site / top).is_symlink():
                    (site / top).symlink_to(base / top)
                continue
            dest, src = Path(os.path.normpath(site / rel)), base / rel
            if not dest.is_relative_to(venv) or not src.exists() or dest.exists():
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.parent == venv / "bin" and (text := src.read_bytes()).startswith(b"#!"):
                dest.write_bytes(text.replace(here, str(venv / "bin").encode()))
                dest.chmod(0o755)
            else:
                dest.symlink_to(src)


@pytest.mark.timeout(300)
def test_every_command_of_the_plugin_guide_runs(tmp_path):
    blocks = bash_blocks()
    assert len(blocks) >= 5, "the guide lost its commands"

    # a fresh environment: stalebench from a wheel of this checkout, with its test extras
    wheels = tmp_path / "wheels"
    build = ["pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels)]
    run([sys.executable, "-m", *build, str(ROOT)], 120)  # as the sweeps' wheel test builds it
    (wheel,) = wheels.glob("stalebench-*.whl")
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], 60)
    (site,) = (venv / "lib").glob("python*/site-packages")
    # its dependencies, and pip, come from this environment (the same releases pip would
    # fetch again: torch alone is hundreds of MB), linked: only what the wheel's metadata
    # requires, so a missing one fails; then pip installs the wheel from no index, which
    # fails unless every requirement is met in the venv
    with zipfile.ZipFile(wheel) as z:
        keep = {n.split("/", 1)[0] for n in z.namelist()}
    link([*dependencies(wheel, ("test",)).values(), distribution("pip")], venv, site, keep)
    script = (venv / "bin" / "pip").read_text()  # the venv's pip, not this environment's
    assert str(venv) in script and str(Path(sys.executable).parent) not in script, script
    # nothing of this process's environment may leak in (PYTHONPATH would make pip see a
    # stalebench already "installed", and the commands import it from the source tree)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    env["VIRTUAL_ENV"] = str(venv)
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--no-index", f"{wheel}[test]"]
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
