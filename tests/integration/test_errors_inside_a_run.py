"""An exception inside a run ends it `failed` with the exception's last line in
summary.json's `error`, in both runtimes: a real rank's (not only "exited with code 1"),
and the simulator's own (which wrote no summary.json before). The trigger is real: the
dataset's files pass the checks before the launch, then vanish before the ranks read them."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from stalebench import experiment
from tests.conftest import compose
from tests.unit.test_data import write_mnist

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("runtime", ["sim", "real"])
def test_an_exception_inside_a_run_is_its_summarys_error(tmp_path, runtime):
    rng = np.random.default_rng(0)
    root = tmp_path / "mnist"
    write_mnist(
        root,
        {
            "x_train": rng.integers(0, 256, size=(40, 8, 8), dtype=np.uint8),
            "y_train": (np.arange(40) % 10).astype(np.uint8),
            "x_test": rng.integers(0, 256, size=(10, 8, 8), dtype=np.uint8),
            "y_test": (np.arange(10) % 10).astype(np.uint8),
        },
        gz=False,
    )
    cfg = compose(
        [f"runtime={runtime}", "dataset=mnist", f"dataset.root={root}", "model=mlp",
         "engine=allreduce", "algorithm=bsp", "cluster.num_workers=2", "dataset.batch_size=4",
         "budget.max_updates=5", "timeout_s=20", "logger=none"]
    )  # fmt: skip
    cfg.run_dir = str(tmp_path / "run")
    engine = experiment.prepare(cfg)  # the files are there
    shutil.rmtree(root)
    summary = experiment.launch(cfg, engine)
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == on_disk["status"] == "failed"
    error = on_disk["error"]
    assert "ConfigError: dataset.root" in error, error  # the exception, by its last line
    if runtime == "real":
        assert error.startswith("worker 0 (rank 0) exited with code 1: ConfigError"), error
    else:
        assert error.startswith("simulator: ConfigError"), error
