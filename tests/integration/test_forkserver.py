"""The fork server a real run's ranks are forked from: a run that imports a module the
running server did not replaces it with one that imports what both do (else every rank of
every later run imports it after its fork: torch._dynamo, ~2 s of CPU a rank); a run whose
modules it has keeps it."""

from __future__ import annotations

import sys
from multiprocessing import forkserver as mp_forkserver

import pytest

from stalebench.runtime import forkserver

pytestmark = pytest.mark.timeout(120)


def _imported(names: list[str]) -> None:  # in a process forked from the server
    sys.exit(0 if all(name in sys.modules for name in names) else 1)


def forked_has(names: list[str]) -> bool:
    """Whether a process forked from the server finds `names` imported at its start."""
    p = forkserver.context().Process(target=_imported, args=(names,))
    p.start()
    p.join(60)
    return p.exitcode == 0


def server() -> int:
    return mp_forkserver._forkserver._forkserver_pid


def test_a_server_without_a_runs_import_is_replaced_by_one_with_both():
    forkserver.start(["tabnanny"])
    first = server()
    assert forked_has(["tabnanny", "torch", "pandas", "pyarrow.parquet"])
    assert not forked_has(["netrc"])

    forkserver.start(["tabnanny"])  # nothing new: the same server
    assert server() == first

    forkserver.start(["netrc"])
    second = server()
    assert second != first
    assert forked_has(["tabnanny", "netrc"])  # what both runs import
    forkserver.start(["tabnanny", "netrc"])
    assert server() == second
