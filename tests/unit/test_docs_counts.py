"""The totals the docs state ("five engines exist", "six built-in barriers") equal the
registries', so that a new component cannot leave a page saying the old number. A count
of something else ("two engines give two rows") is not a total: a total is said with
"exist", "are registered" or "built-in"."""

from __future__ import annotations

import re
from pathlib import Path

from stalebench import plugins
from stalebench.algorithms.base import BARRIERS, UPDATES
from stalebench.engines.base import ENGINES

ROOT = Path(__file__).resolve().parents[2]
WORDS = "zero one two three four five six seven eight nine ten eleven twelve thirteen".split()
KINDS = {"engines": ENGINES, "barriers": BARRIERS, "update rules": UPDATES}
COUNT = re.compile(
    rf"\b({'|'.join(WORDS)}|\d+)\s+(?:built-in\s+)?({'|'.join(KINDS)})\s+(?:exist|are registered)"
    rf"|\b({'|'.join(WORDS)}|\d+)\s+built-in\s+({'|'.join(KINDS)})\b",
    re.IGNORECASE,
)


def stated() -> list[tuple[str, str, int]]:
    """(file, kind, number) of every "<number> <kind>" in README.md and docs/*.md."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in COUNT.finditer(path.read_text()):
            number, kind = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            n = int(number) if number.isdigit() else WORDS.index(number.lower())
            found.append((path.name, kind.lower(), n))
    return found


def test_every_count_the_docs_state_is_the_registrys():
    plugins.load()
    found = stated()
    assert ("design.md", "engines", len(ENGINES.names())) in found  # the one this checks
    wrong = [(f, k, n, len(KINDS[k].names())) for f, k, n in found
             if n != len(KINDS[k].names())]  # fmt: skip
    assert not wrong, wrong
