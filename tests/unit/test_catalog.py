"""`stalebench list`: every registered component and YAML preset, one line each, plugins
included."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stalebench.algorithms.base import BARRIERS, UPDATES
from stalebench.catalog import first_line, sections, yaml_summary
from stalebench.config import ENGINES
from stalebench.errors import ConfigError
from stalebench.models import MODELS

ROOT = Path(__file__).resolve().parents[2]


def listed(*imports: str, path: Path | None = None) -> str:
    code = "".join(f"import {m}; " for m in imports) + "from stalebench.cli import main; main()"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (path, ROOT) if p)}
    out = subprocess.run(
        [sys.executable, "-c", code, "list"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_list_names_every_component_with_a_description():
    text = listed()
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ")}
    for registry in (ENGINES, BARRIERS, UPDATES, MODELS):
        for name in registry.names():
            if not registry.get(name)[0].__module__.startswith("stalebench."):
                continue  # registered by another test in this process, not in `list`'s
            assert name in lines, name
            assert len(lines[name].split()) > 2, f"{name} has no description"
    for preset in ("ssp", "gpipe", "heterogeneous", "slow_network", "dssp_full"):
        assert len(lines[preset].split()) > 2, preset
    titles = [title for title, _ in sections()]
    assert all(title in text for title in titles)


def test_list_includes_a_plugin_registered_outside_the_package(tmp_path):
    """The engine guide's example (docs/engines.md), as a user's module outside the package."""
    guide = (ROOT / "docs" / "engines.md").read_text()
    (tmp_path / "guide_engine.py").write_text(guide.split("```python\n", 1)[1].split("```", 1)[0])
    text = listed("guide_engine", path=tmp_path)
    (line,) = [ln for ln in text.splitlines() if ln.split()[:1] == ["sequential"]]
    assert "One process trains alone" in line


def test_descriptions_are_first_sentences():
    assert first_line("Never wait.\n\nMore text.") == "Never wait"
    assert first_line("A long\nwrapped sentence. Then more.") == "A long wrapped sentence"
    assert first_line("x" * 200, width=10) == "x" * 9 + "…"
    # a period after an abbreviation does not end the sentence
    he = "The CIFAR ResNet of He et al. 2016, §4.2, e.g. ResNet-20. Then more."
    assert first_line(he) == "The CIFAR ResNet of He et al. 2016, §4.2, e.g. ResNet-20"
    assert yaml_summary("# @package _global_\n# One. Two.\n# three\nkey: 1\n") == "One"


def test_a_part_group_is_listed_by_its_last_name_too():
    from stalebench.catalog import render

    assert render("update") == render("algorithm/update")
    assert render("update").startswith("update rules (algorithm/update=)")
    assert render("barrier").startswith("barriers (algorithm/barrier=)")
    with pytest.raises(ConfigError, match="list: no group 'modle'; did you mean model?"):
        render("modle")
