"""Which `raise ConfigError(...)` sites (and `raise bad(...)`, their helper) of stalebench/
a coverage run executed, and the share:

    coverage run --source=stalebench -m pytest -n 0 tests/unit
    python tests/raise_sites.py [.coverage]
"""

import ast
import sys
from pathlib import Path

import coverage

cov = coverage.Coverage(data_file=sys.argv[1] if len(sys.argv) > 1 else ".coverage")
cov.load()
data = cov.get_data()
sites, hit = [], 0
for path in sorted(Path("stalebench").rglob("*.py")):
    tree = ast.parse(path.read_text())
    executed = set(data.lines(str(path.resolve())) or [])
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            f = node.exc.func
            name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")
            if name in ("ConfigError", "bad"):
                ok = node.lineno in executed
                hit += ok
                sites.append((str(path), node.lineno, ok))
for p, line, ok in sites:
    if not ok:
        print(f"  not run: {p}:{line}")
print(f"{hit}/{len(sites)} ConfigError raise sites executed ({100 * hit / len(sites):.0f} %)")
