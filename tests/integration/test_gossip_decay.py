"""SGP with a decaying local step (algorithm.inner.lr_decay): the nodes end closer to
consensus than at a constant step, summary.json's consensus_final is the mean of each
node's last recorded distance, and real processes take the same scheduled steps as the
simulator."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import run_job

SGP = ["algorithm=sgp", "cluster.num_workers=8", "budget.max_updates=60", "algorithm.inner.lr=0.1"]
INVERSE_SQRT = ["algorithm.inner.lr_decay=inverse_sqrt", "algorithm.inner.lr_decay_steps=5"]
COSINE = ["algorithm.inner.lr_decay=cosine", "algorithm.inner.lr_decay_steps=60"]


def last_distances(run) -> dict[int, float]:
    last: dict[int, tuple[int, float]] = {}
    for e in run.events:
        if e["kind"] == "update" and "consensus" in e:
            if e["version"] >= last.get(e["worker"], (-1, 0.0))[0]:
                last[e["worker"]] = (e["version"], e["consensus"])
    return {w: d for w, (_, d) in last.items()}


@pytest.mark.timeout(90)
def test_a_decaying_step_ends_closer_to_consensus_than_a_constant_one(tmp_path):
    constant = run_job(tmp_path / "constant", ["runtime=sim", *SGP])
    inverse_sqrt = run_job(tmp_path / "inverse_sqrt", ["runtime=sim", *SGP, *INVERSE_SQRT])
    cosine = run_job(tmp_path / "cosine", ["runtime=sim", *SGP, *COSINE])
    for run in (constant, inverse_sqrt, cosine):
        assert run.summary["status"] == "completed", run.summary["error"]
        distances = last_distances(run)
        assert sorted(distances) == list(range(8))  # every node's, from the last meeting
        assert run.summary["consensus_final"] == pytest.approx(np.mean(list(distances.values())))
    final = {
        name: run.summary["consensus_final"]
        for name, run in (
            ("constant", constant),
            ("inverse_sqrt", inverse_sqrt),
            ("cosine", cosine),
        )
    }
    assert final["constant"] > 0
    # the step ends at 1/√(1 + 59/5) ≈ 0.28 of η: the distance it keeps open shrinks with it
    assert final["inverse_sqrt"] < 0.5 * final["constant"], final
    # cosine ends at a step of 0: the gossip closes the distance the steps opened
    assert final["cosine"] < 0.05 * final["constant"], final


@pytest.mark.timeout(60)
def test_a_run_without_gossip_has_no_consensus_distance(tmp_path):
    run = run_job(tmp_path / "run", ["runtime=sim", "algorithm=bsp", "budget.max_updates=5"])
    assert "consensus_final" not in run.summary


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_real_processes_take_the_simulators_scheduled_steps(tmp_path):
    common = ["algorithm=sgp", "cluster.num_workers=4", "budget.max_updates=20"]
    common += ["algorithm.inner.lr=0.1", "algorithm.inner.lr_decay=cosine"]
    common += ["algorithm.inner.lr_decay_steps=20"]
    real = run_job(tmp_path / "real", common)
    simulated = run_job(tmp_path / "sim", ["runtime=sim", *common])
    steps = lambda run: sorted(  # noqa: E731
        (e["clock"], e["worker"], e["loss"]) for e in run.events if e["kind"] == "update"
    )
    assert [r[2] for r in steps(real)] == pytest.approx([r[2] for r in steps(simulated)], rel=1e-4)
    assert real.summary["consensus_final"] == pytest.approx(
        simulated.summary["consensus_final"], rel=1e-3, abs=1e-7
    )
