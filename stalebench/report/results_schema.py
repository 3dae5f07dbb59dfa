"""The schema of a committed results/<sweep>/claims.json (a file, its provenance and its
verdicts) and its reader.

Every claims.json read (the sweep's on `save`, each committed one on render and
`--check`) is first checked against VERDICT_SCHEMA and FILE_SCHEMA below: a missing key, a
value of the wrong type or outside its choices, or a file that is not JSON is one error line
naming the file, the claim and the key, and nothing is written.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from stalebench.report import claim_judge
from stalebench.sweep import ORIGINS

SELF_CHECK = "self-check"  # a verdict's origin: a check of the harness, tallied apart
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclasses.dataclass(frozen=True)
class Field:
    """A key of claims.json: the JSON types its value may take, whether it must be there,
    and the values it may take (any when empty)."""

    types: tuple[type, ...]
    required: bool = True
    choices: tuple[str, ...] = ()


TEXT, NUMBER, OBJECT, NULL = (str,), (int, float), (dict,), (type(None),)
# The keys this module, claims.table and claims.tally read, with the types they format
# (what claims._result writes and `save` adds); other keys (kind, n, estimate, steps, …)
# are kept and never read. `provenance`'s parts are read with .get: only their type counts.
FILE_SCHEMA = {
    "claims": Field((list,)),
    "provenance": Field(OBJECT, required=False),
    # the runs' `sweep` block (claims, second stage), saved beside a runs.csv: what --check
    # judges the table's runs by
    "sweep_config": Field(OBJECT, required=False),
}
PROVENANCE_SCHEMA = {
    "command": Field(TEXT + NULL, required=False),
    **{
        key: Field(OBJECT, required=False)
        for key in ("git", "machine", "wall_time", "runs", "look_runs", "tuning_runs")
    },
    "environment": Field(OBJECT + NULL, required=False),
}
VERDICT_SCHEMA = {
    "sweep": Field(TEXT),
    "id": Field(TEXT),
    "text": Field(TEXT),
    "origin": Field(TEXT, choices=ORIGINS),
    "margin": Field(NUMBER),
    "threshold_from": Field(TEXT),
    "scope": Field(TEXT),
    "metric": Field(TEXT),
    "published": Field(TEXT),
    "source": Field(TEXT),
    "ours": Field(TEXT),
    "sides": Field(OBJECT + NULL, required=False),
    "p": Field(NUMBER + NULL),
    "p_holm": Field(NUMBER + NULL),
    "verdict": Field(TEXT, choices=claim_judge.VERDICTS),
    "notes": Field(TEXT),
    "paper": Field(TEXT + NULL, required=False),
    "scale": Field(TEXT + NULL, required=False),
    # the second stage (written since there is one): the look a claim was decided at, of
    # how many, at what α, and the minimum detectable effect there
    "look": Field(NUMBER, required=False),
    "looks": Field(NUMBER, required=False),
    "alpha": Field(NUMBER, required=False),
    "mde": Field(NUMBER + NULL, required=False),
    # kind=reproduces: the published number, ours, ours / paper and the tolerance
    "reproduced": Field(OBJECT + NULL, required=False),
    # what the verdict rests on (written since they are): caveats (blow-up after the target,
    # a target met at t = 0, one measurement), why a paired test fell back to Welch's, and
    # the Holm family of the deciding look
    "caveats": Field((list,), required=False),
    "test_why": Field(TEXT, required=False),
    "family": Field(OBJECT + NULL, required=False),
}
_JSON_NAMES = {
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    list: "a list",
    dict: "an object",
    type(None): "null",
}


class ClaimsFileError(ValueError):
    """A claims.json that cannot be rendered: one line per problem, each naming the file
    (and the claim and the key)."""


def _kind(value: Any) -> str:
    return _JSON_NAMES.get(type(value), type(value).__name__)


def violations(obj: Any, schema: dict[str, Field], where: str) -> list[str]:
    """What in `obj` breaks `schema`, one line each, prefixed with `where`."""
    if not isinstance(obj, dict):
        return [f"{where}is {_kind(obj)}, not an object"]
    out = []
    for key, field in schema.items():
        if key not in obj:
            if field.required:
                out.append(f'{where}no "{key}"')
            continue
        value = obj[key]
        # JSON's true/false are not numbers, though Python's bool is an int
        if not isinstance(value, field.types) or (
            isinstance(value, bool) and bool not in field.types
        ):
            wanted = " or ".join(dict.fromkeys(_JSON_NAMES[t] for t in field.types))
            out.append(f'{where}"{key}" is {_kind(value)}, not {wanted}')
        elif field.choices and value not in field.choices:
            out.append(f'{where}"{key}" is "{value}", not one of {", ".join(field.choices)}')
    return out


def read_claims(
    path: Path, shown: str | Path | None = None, sweep: str | None = None
) -> dict[str, Any]:
    """A claims.json checked against the schema above (and, with `sweep`, every verdict
    of that sweep); raises ClaimsFileError naming the file as `shown` (default: its path)."""
    shown = str(shown or path)
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:  # the message names the position, not the file
        raise ClaimsFileError(
            f"{shown}: not JSON (truncated or damaged): {err.msg} at line {err.lineno}, "
            f"column {err.colno} (char {err.pos})"
        ) from None
    except UnicodeDecodeError as err:
        raise ClaimsFileError(f"{shown}: not UTF-8 text at byte {err.start}") from None
    problems = violations(data, FILE_SCHEMA, f"{shown}: ")
    if not isinstance(data, dict):
        raise ClaimsFileError("\n".join(problems))
    if isinstance(data.get("provenance"), dict):
        problems += violations(data["provenance"], PROVENANCE_SCHEMA, f"{shown}: provenance: ")
    claims = data.get("claims")
    if claims == []:  # `save` never writes one: it would render as "no claims"
        problems.append(f'{shown}: "claims" is empty')
    for i, verdict in enumerate(claims if isinstance(claims, list) else []):
        name = verdict.get("id") if isinstance(verdict, dict) else None
        where = f"{shown}: claims[{i}]" + (f" ({name})" if isinstance(name, str) else "") + ": "
        problems += violations(verdict, VERDICT_SCHEMA, where)
        own = verdict.get("sweep") if isinstance(verdict, dict) else None
        if sweep is not None and isinstance(own, str) and own != sweep:  # tallied nowhere
            problems.append(f'{where}"sweep" is "{own}", not "{sweep}" (its directory)')
    if problems:
        raise ClaimsFileError("\n".join(problems))
    return data
