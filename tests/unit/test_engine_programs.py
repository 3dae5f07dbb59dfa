"""Registering the engines imports no torch (a command line is checked before torch loads),
and each engine's `load_programs` marks every class its checkpoints may hold: a class of its
package decorated `@stored` is known to the checkpoint reader once its programs are loaded
(a resumed run reads the checkpoint before it starts a program). In a fresh interpreter."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ENGINES = Path(__file__).resolve().parents[2] / "stalebench" / "engines"


def stored_classes(package: Path) -> set[str]:
    """module.Class of every class decorated `@stored` under `package` (or in its module)."""
    files = sorted(package.rglob("*.py")) if package.is_dir() else [package.with_suffix(".py")]
    found = set()
    for path in files:
        module = ".".join(path.relative_to(ENGINES.parent.parent).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                getattr(d, "id", None) == "stored" for d in node.decorator_list
            ):
                found.add(f"{module}.{node.name}")
    return found


CODE = """
import json, sys
from stalebench import plugins
from stalebench.config import register_configs
from stalebench.engines.base import ENGINES
plugins.load(); register_configs()
torch_before = "torch" in sys.modules
ENGINES.get(sys.argv[1])[0].load_programs()
from stalebench.registry import STORED
print(json.dumps({"torch_before": torch_before,
                  "stored": sorted(f"{c.__module__}.{c.__qualname__}" for c in STORED)}))
"""


@pytest.mark.parametrize("engine", ["ps", "allreduce", "local", "gossip", "pipeline"])
def test_registering_needs_no_torch_and_loading_programs_marks_the_stored_classes(engine):
    out = subprocess.run([sys.executable, "-c", CODE, engine], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["torch_before"] is False
    missing = stored_classes(ENGINES / engine) - set(got["stored"])
    assert not missing, f"engine={engine}: load_programs leaves {missing} unknown to a checkpoint"
