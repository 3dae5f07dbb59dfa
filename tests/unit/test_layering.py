"""DESIGN.md's rules kept by a test: no algorithm names outside stalebench/algorithms/, and
the pure layers import no process or runtime machinery."""

import ast
from pathlib import Path

from stalebench.algorithms import BARRIERS, UPDATES
from stalebench.algorithms.pipeline import OPTIMIZERS, SCHEDULES

PACKAGE = Path(__file__).resolve().parents[2] / "stalebench"


def modules(exclude: str | None = None):
    for path in PACKAGE.rglob("*.py"):
        if exclude is None or exclude not in path.relative_to(PACKAGE).parts:
            yield path, ast.parse(path.read_text())


def test_no_algorithm_name_outside_the_algorithms_package():
    names = set(BARRIERS.names()) | set(UPDATES.names()) | set(OPTIMIZERS.names()) | set(SCHEDULES)
    found = [
        f"{path.relative_to(PACKAGE)}:{node.lineno} {node.value!r}"
        for path, tree in modules(exclude="algorithms")
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in names
    ]
    assert not found, found


def imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_pure_layers_do_not_import_processes_or_runtimes():
    for part in ("algorithms", "engines"):
        for path in (PACKAGE / part).rglob("*.py"):
            bad = [
                m
                for m in imports(ast.parse(path.read_text()))
                if m.startswith(
                    (
                        "torch.distributed",
                        "torch.multiprocessing",
                        "multiprocessing",
                        "stalebench.runtime",
                        "subprocess",
                    )
                )
            ]
            assert not bad, (path.name, bad)
