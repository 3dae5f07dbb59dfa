"""The line the CLI prints per run: rounded numbers, the run directory last."""

from __future__ import annotations

from stalebench.cli import _print_result


def summary(mean_lag):
    return {
        "status": "completed", "algorithm": "ssp", "seed": 0, "num_workers": 4,
        "updates": 202, "run_time_s": 20.04, "clock": "real",
        "final": {"accuracy": 0.912345, "loss": 0.3},
        "lag": {"mean": mean_lag}, "error": None,
    }  # fmt: skip


def test_the_result_line_rounds_its_numbers(capsys):
    _print_result(summary(1.5524752475247525), "runs/x")
    line = capsys.readouterr().out.strip()
    assert line == (
        "[completed] ssp seed=0 workers=4 updates=202 real_time=20.0s test_accuracy=0.9123 "
        "test_loss=0.3 mean_lag=1.55 -> runs/x"
    )
    _print_result(summary(None), "runs/y")  # no update: no lag
    assert "mean_lag=None -> runs/y" in capsys.readouterr().out
