"""The real runtime's supervisor ends a run that outlives its allowance itself: status
`timeout` in summary.json, its own error text, and no rank left running. The ranks here
belong to an engine that never returns (`Hang`), spawned for real."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from stalebench import experiment
from stalebench.engines.base import Engine
from tests.conftest import FAST, compose


class Hang(Engine):
    """Every rank writes its pid, then never returns."""

    def program(self, job, world):
        (world.run_dir / f"pid-{world.rank}").write_text(str(os.getpid()))
        time.sleep(3600)
        yield


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")  # a zombie is not a process left behind
    return stat.exists() and stat.read_text().split()[2] != "Z"


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_run_past_its_allowance_ends_as_timeout_with_no_rank_left(tmp_path):
    cfg = compose(
        [*FAST[:-1], "cluster.num_workers=2", "budget.max_wall_s=1", "timeout_s=2", "grace_s=3"]
    )
    cfg.run_dir = str(tmp_path)
    start = time.monotonic()
    summary = experiment.launch(cfg, Hang(cfg.engine, cfg))
    took = time.monotonic() - start
    # allowance: max_wall_s + 2 * timeout_s + grace_s = 1 + 4 + 3 s
    assert summary["status"] == "timeout"
    assert summary["error"] == "the run did not end within 8 s"
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert 8 <= took < 30, took
    pids = [int((tmp_path / f"pid-{r}").read_text()) for r in range(2)]  # every rank
    assert not [pid for pid in pids if _alive(pid)]
    assert not multiprocessing.active_children()
