"""docs/usage.md's "From Python" block runs as written (in a temporary directory), and its
refusal is a ConfigError naming the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stalebench.errors import ConfigError

DOC = Path(__file__).resolve().parents[2] / "docs" / "usage.md"


def block() -> str:
    text = DOC.read_text()
    section = text[text.index("## From Python") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_documented_python_api_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(block(), str(DOC), "exec"), scope)  # noqa: S102  (our own docs)
    assert scope["summary"]["status"] == "completed"
    assert (tmp_path / "runs" / "ssp-sim" / "summary.json").is_file()
    assert scope["test"] and len(scope["metrics"]) > 0
    assert capsys.readouterr().out.startswith("completed ")


def test_compose_run_refuses_an_unknown_key_by_name():
    from stalebench.cli import compose_run

    with pytest.raises(ConfigError, match="budget.max_wall: no such config key; did you mean"):
        compose_run(["budget.max_wall=3"])
    with pytest.raises(ConfigError, match="algorithm: unknown 'sssp'; did you mean ssp"):
        compose_run(["algorithm=sssp"])
