"""The papers' sweeps: every sweep and arm composes into a valid run config whose claims
validate, a claim names only arms its sweep runs, a paper sweep runs end to end through the
installed `stalebench` command from outside the checkout (report, claims.json, a verdict per
claim), and a wheel of the project ships the configs and the sweeps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import LEAST_STAGES, TINY_DSSP_SWEEP, compose

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
SWEEPS = ROOT / "sweeps"
PAPERS = sorted(p.stem for p in SWEEPS.glob("*.yaml"))


def sweep_params(name: str) -> dict[str, list[str]]:
    """The sweep's own grid: hydra.sweeper.params of its file (and of the file it extends)."""
    raw = yaml.safe_load((SWEEPS / f"{name}.yaml").read_text()) or {}
    params = {}
    for parent in raw.get("defaults") or []:
        if isinstance(parent, str) and (SWEEPS / f"{parent}.yaml").is_file():
            params.update(sweep_params(parent))
    for key, values in ((raw.get("hydra") or {}).get("sweeper") or {}).get("params", {}).items():
        params[key] = [v.strip() for v in str(values).split(",")]
    return params


def test_the_sweeps_folder_is_the_sweep_config_group():
    # conf/ and sweeps/ sit at the top of the checkout; the package sees them through symlinks
    assert (ROOT / "stalebench" / "conf").resolve() == CONF.resolve()
    assert (CONF / "sweep").resolve() == SWEEPS.resolve()
    assert (ROOT / "stalebench" / "conf" / "sweep").resolve() == SWEEPS.resolve()
    assert {"ssp", "dssp", "psp", "gap_aware", "dana", "nesterov_pp", "sdde", "das"} <= set(PAPERS)


def values_in(path: Path) -> dict[str, object]:
    """The dotted keys a sweep or arm file sets, with their values (interpolations left out)."""
    raw = yaml.safe_load(path.read_text())

    def flat(node, prefix=""):
        for key, value in (node or {}).items():
            if key == "defaults":
                continue
            if isinstance(value, dict):
                yield from flat(value, f"{prefix}{key}.")
            elif not (isinstance(value, str) and "${" in value):
                yield f"{prefix}{key}", value

    return dict(flat(raw))


def lookup(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = cfg[part] if isinstance(cfg, dict) else getattr(cfg, part)
    return cfg


@pytest.mark.parametrize("name", PAPERS)
def test_every_arm_of_every_sweep_composes_and_keeps_its_values(name):
    """Composed in the order Hydra's sweeper uses (the grid's overrides first, then
    `+sweep=<name>`), every arm's own values must survive: an arm setting a key the sweep
    file also sets would silently lose it (the sweep file is merged after the arm). A full
    variant's own settings are deliberate overrides at the paper's scale (its η, say)."""
    params = sweep_params(name)
    arms = {k: v for k, v in params.items() if k.startswith("+sweep/arms/")}
    assert arms, f"sweeps/{name}.yaml sweeps no arms"
    others = [f"{k}={v[0]}" for k, v in params.items() if k not in arms and k != "seed"]
    deliberate = set(values_in(SWEEPS / f"{name}.yaml")) if name.endswith("_full") else set()
    labels = set()
    for key, options in arms.items():
        fixed = [f"{k}={v[0]}" for k, v in arms.items() if k != key]
        for option in options:
            cfg = compose([f"{key}={option}", *fixed, *others, f"+sweep={name}"])
            assert cfg.sweep.name == name  # results/<name>/, its W&B group: one sweep's
            assert cfg.sweep.claims, name
            arm = SWEEPS / key.removeprefix("+sweep/") / f"{option}.yaml"
            for dotted, value in values_in(arm).items():
                if dotted not in deliberate:
                    assert lookup(cfg, dotted) == value, (name, option, dotted)
            labels.add(cfg.label)
    for claim in cfg.sweep.claims:
        for side in (claim.a, claim.b, claim.c):
            named = side.get("algorithm", claim.where.get("algorithm"))
            if named is not None:
                assert named in labels, (name, claim.id, named, sorted(labels))


def stalebench_command() -> str:
    """The console script installed beside this interpreter (the installed package's entry)."""
    script = Path(sys.executable).parent / "stalebench"
    assert script.is_file(), f"no stalebench script beside {sys.executable}"
    return str(script)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_paper_sweep_runs_end_to_end_from_outside_the_checkout(tmp_path):
    """`stalebench -m +sweep=dssp` at a tiny scale (two arms, two seeds, 2 workers, 1 s of
    virtual time) from a directory that is not the checkout: every claim gets a verdict.
    Its stages at their least (the protocol's own tests: tests/integration/test_tuning.py)."""
    args = [*TINY_DSSP_SWEEP, *LEAST_STAGES, "logger=none"]
    env = {**os.environ, "PYTHONPATH": ""}
    done = subprocess.run(
        [stalebench_command(), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sweep = tmp_path / "sweep"
    # the final runs (a tuned sweep keeps its tuning stage apart, under tune/)
    summaries = [json.loads(p.read_text()) for p in sweep.glob("*/summary.json")]
    assert sorted((s["algorithm"], s["seed"]) for s in summaries) == [
        ("BSP", 0),
        ("BSP", 1),
        ("DSSP[3,15]", 0),
        ("DSSP[3,15]", 1),
    ]
    verdicts = json.loads((sweep / "claims.json").read_text())["claims"]
    claims = yaml.safe_load((SWEEPS / "dssp.yaml").read_text())["sweep"]["claims"]
    assert [v["id"] for v in verdicts] == [c["id"] for c in claims]
    by_id = {v["id"]: v for v in verdicts}
    # the arms this run left out are reported as such, never dropped
    assert by_id["before-ssp"]["verdict"] == "not run"
    assert by_id["close-to-asp"]["verdict"] == "not run"
    # the claims between the two arms that ran got a real verdict
    for claim in ("before-bsp", "much-faster-than-bsp-homogeneous"):
        assert by_id[claim]["verdict"] in ("holds", "does not hold", "inconclusive", "not run")
    assert by_id["before-bsp"]["verdict"] != "not run"
    assert "## Claims" in (sweep / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_wheel_of_the_project_ships_every_config_sweep_and_arm(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=280,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = tmp_path.glob("stalebench-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        "stalebench/conf/sweep/" + str(p.relative_to(SWEEPS)) for p in SWEEPS.rglob("*.yaml")
    }
    assert expected and expected <= shipped, sorted(expected - shipped)
    # the tuning sweeper, where Hydra's plugin scan finds it: a namespace package (no
    # hydra_plugins/__init__.py, which would hide every other plugin)
    assert "hydra_plugins/stalebench_sweeper/sweeper.py" in shipped
    assert "hydra_plugins/__init__.py" not in shipped
    assert "stalebench/tuning.py" in shipped
    # conf/ itself (config.yaml, the presets) is the package `stalebench.conf` in the wheel
    configs = {
        "stalebench/conf/" + str(p.relative_to(CONF))
        for p in CONF.rglob("*.yaml")
        if "sweep" not in p.relative_to(CONF).parts
    }
    assert "stalebench/conf/config.yaml" in configs
    assert "stalebench/conf/algorithm/gpipe.yaml" in configs
    assert configs <= shipped, sorted(configs - shipped)
    assert "stalebench/conf/__init__.py" in shipped
