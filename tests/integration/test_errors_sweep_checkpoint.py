"""A sweep rerun (resume=true) where one job's checkpoint cannot be gone on from: that job
fails alone, its directory left as it was, the others run, and the sweep's end names it in
one line (the exit code says a job measured nothing). With logger=none each job that ran
says where its run directory is."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from stalebench.job import config_sha
from tests.conftest import compose
from tests.integration.test_cli import FAST, stalebench

pytestmark = pytest.mark.slow

ARGS = ["runtime=sim", "cluster.num_workers=2", "budget.max_updates=20", "logger=none"]


def files(folder: Path) -> dict[str, bytes]:
    """The job's files (Hydra's own, which every launch of the job writes, apart)."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and not {".hydra", "cli.log"} & set(p.parts)
    }


@pytest.mark.timeout(180)
def test_a_job_with_a_bad_checkpoint_fails_alone_and_the_sweep_end_names_it(tmp_path):
    sweep = tmp_path / "sweep"
    args = [*FAST, *ARGS]
    # job 1 was stopped before: a checkpoint of its config, whose state.pt is random bytes
    bad = sweep / "1"
    (bad / "checkpoint").mkdir(parents=True)
    sha = config_sha(compose([*args, "seed=1"]))
    (bad / "checkpoint" / "config.json").write_text(json.dumps({"config_sha": sha}))
    (bad / "checkpoint" / "state.pt").write_bytes(random.Random(1).randbytes(4096))
    before = files(bad)

    rerun = ["-m", *args, "seed=0,1,2", "resume=true", f"hydra.sweep.dir={sweep}"]
    done = stalebench(rerun, tmp_path, 170)

    assert done.returncode == 1, done.stderr[-3000:]
    for job in (0, 2):  # the others ran, each saying where it went
        summary = json.loads((sweep / str(job) / "summary.json").read_text())
        assert summary["status"] == "completed"
        assert f"[completed] -> {sweep / str(job)}\n" in done.stdout
    assert files(bad) == before  # nothing of the refused job's directory changed
    last = done.stderr.strip().splitlines()[-1]  # at the sweep's end, after its report
    assert last.startswith(
        f"stalebench: error: {bad}: not run: resume=true: {bad}/checkpoint/state.pt: not "
        "loaded: not a stalebench checkpoint"
    ), done.stderr[-3000:]
    assert "weights_only" not in done.stderr
