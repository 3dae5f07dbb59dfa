"""The git state of a checkout: which commit a result's code was, and whether its tree
differed from it (what a run records of the code that ran it, and what `stalebench-results
save` records of the tree that saved a sweep)."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any


def git_state(root: Path) -> dict[str, Any]:
    """The checkout's commit and whether its tree differs from it (tracked changes or
    untracked files git does not ignore); commit None outside a git checkout."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None, "dirty_paths": []}
    status = git("status", "--porcelain") or ""
    paths = [line[3:] for line in status.splitlines() if line.strip()]
    return {"commit": commit.strip(), "dirty": bool(paths), "dirty_paths": paths[:50]}


@functools.cache
def code_state() -> dict[str, Any]:
    """The git state of the checkout this package is imported from (commit None when it is
    not one: an installed wheel)."""
    return git_state(Path(__file__).resolve().parents[1])
