"""Sweeps through Hydra's other launchers: joblib runs jobs in parallel on one machine, real
multi-process jobs side by side without colliding (each its own directory, store port and
process group); the SLURM launcher (submitit) composes with the settings docs/usage.md shows."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_cli import FAST, stalebench

pytestmark = pytest.mark.slow

# docs/usage.md's SLURM example, as overrides
SLURM = [
    "hydra/launcher=submitit_slurm",
    "hydra.launcher.partition=gpu",
    "hydra.launcher.timeout_min=240",
    "hydra.launcher.tasks_per_node=1",
    "hydra.launcher.cpus_per_task=8",
    "hydra.launcher.mem_gb=32",
]


@pytest.mark.timeout(300)
def test_a_parallel_joblib_sweep_of_real_runs_never_collides(tmp_path):
    done = stalebench(
        ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.sweep.dir=sweep"]
        + ["algorithm=asp,ssp", "seed=0", "cluster.num_workers=2", *FAST[:-1]]
        + ["budget.max_updates=60", "logger=none"],
        tmp_path,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summaries = [
        json.loads(p.read_text()) for p in sorted((tmp_path / "sweep").glob("*/summary.json"))
    ]
    assert [(s["status"], s["updates"]) for s in summaries] == [("completed", 60)] * 2
    assert sorted((s["algorithm"], s["seed"]) for s in summaries) == [("asp", 0), ("ssp", 0)]
    assert "Runs: 2 (2 completed)" in (tmp_path / "sweep" / "report.md").read_text()


def test_the_slurm_launcher_composes_with_the_readme_settings():
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from stalebench.config import register_configs
    from stalebench.plugins import load as load_plugins

    load_plugins()
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module("stalebench.conf", version_base=None):
            cfg = compose("config", overrides=SLURM, return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
    launcher = cfg.hydra.launcher
    assert (
        launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    )
    assert (launcher.partition, launcher.timeout_min, launcher.cpus_per_task) == ("gpu", 240, 8)
    assert (launcher.tasks_per_node, launcher.mem_gb) == (1, 32)
