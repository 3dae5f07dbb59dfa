"""The per-run table a committed result carries (results/<sweep>/runs.csv): `save` writes it
from a sweep's real run directories with the numbers its claims read, `--check` judges the
claims again from it alone with the evaluator and names a claim whose verdict, effect or p
changed; provenance and overrides carry no path of the machine that ran the sweep."""

import json

import numpy as np
import pytest
import yaml

from stalebench.metrics.summary import write_json
from stalebench.report import claims as C
from stalebench.report import results as R
from stalebench.report.collect import collect
from tests.unit.test_results import ROOT

CLAIMS = [
    {"id": "one-ends-higher", "origin": "paper", "metric": "final_accuracy", "better": "higher",
     "margin": 0.01, "a": {"cluster.num_workers": 1}, "b": {"cluster.num_workers": 4},
     "published": "91.4 % against 90.8 %"},
    {"id": "four-is-sooner", "origin": "paper", "metric": "time_to_target", "better": "lower",
     "target": {"split": "test", "key": "accuracy", "value": 0.8}, "margin": 0.5,
     "a": {"cluster.num_workers": 4}, "b": {"cluster.num_workers": 1}},
    {"id": "four-diverges", "origin": "paper", "kind": "diverges", "better": "lower",
     "margin": 0, "a": {"cluster.num_workers": 4}},
    {"id": "one-reproduces", "origin": "paper", "kind": "reproduces", "metric": "final_accuracy",
     "better": "higher", "value": 0.9, "tolerance": 1.5, "margin": 0,
     "a": {"cluster.num_workers": 1}},
]  # fmt: skip
SWEEP = {"name": "toy", "paper": "A. Toy. Stale Things. 2026", "scale": "small",
         "claims": CLAIMS, "sequential": {"block": 2, "max_seeds": 5}}  # fmt: skip


def run(d, workers, seed, accuracy, reach, status="completed", look=1):
    """A run directory as a finished run leaves it: its config (with the sweep's claims),
    overrides (a dataset on this machine's disk among them), summary and evaluations (test
    accuracy rising to `accuracy`, past 0.8 at `reach`: None, never)."""
    (d / ".hydra").mkdir(parents=True)
    config = {"seed": seed, "cluster": {"num_workers": workers}, "sweep": {**SWEEP, "look": look}}
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    overrides = ["+sweep=toy", f"+sweep/arms/toy=n{workers}", f"seed={seed}",
                 "dataset.root=/home/someone/data/mnist"]  # fmt: skip
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    ts = np.arange(1, 11, dtype=float)
    accs = np.minimum(0.75, 0.5 + 0.05 * ts) if reach is None else np.where(
        ts >= reach, accuracy, 0.7)  # fmt: skip
    events = [{"kind": "eval", "t": t, "version": int(10 * t), "split": "test", "loss": 1.0 - a,
               "accuracy": a} for t, a in zip(ts, accs, strict=True)]  # fmt: skip
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    summary = {"status": status, "seed": seed, "num_workers": workers, "algorithm": "ASP",
               "wall_time_s": 10.0, "final_tail_evals": 1, "final_tail_accuracy": accuracy,
               "chance_accuracy": 0.1}  # fmt: skip
    (d / "summary.json").write_text(json.dumps(summary))


@pytest.fixture()
def checkout(tmp_path):
    """A checkout's README with the results block (outside git: the commit is None)."""
    root = tmp_path / "checkout"
    root.mkdir()
    (root / "README.md").write_text(f"# toy\n\n{R.BEGIN}\n{R.END}\n")
    return root


@pytest.fixture()
def sweep_dir(tmp_path):
    """Sweep `toy`: 1 and 4 workers at seeds 0-2 (a 4-worker run diverged, one never
    reaches the target), a second look's seeds 3-4; its claims.json the evaluator's."""
    d = tmp_path / "sweeps" / "toy_abc1234"
    rng = np.random.default_rng(3)
    job = 0
    for seed in range(5):
        look = 1 if seed < 3 else 2
        where = d if look == 1 else d / "look2"
        for workers in (1, 4):
            accuracy = float((0.91 if workers == 1 else 0.88) + 0.01 * rng.standard_normal())
            reach = float(6 if workers == 1 else 3 + rng.integers(0, 2))
            status = "diverged" if (workers, seed) == (4, 2) else "completed"
            run(where / str(job), workers, seed, accuracy, None if (workers, seed) == (4, 1)
                else reach, status, look)  # fmt: skip
            job += 1
    runs, curves, _ = collect([d])
    verdicts = C.evaluate(runs, curves)
    write_json(d / "claims.json", {"rule": C.RULE, "alpha": C.ALPHA,
                                   "correction": C.CORRECTION, "claims": verdicts})  # fmt: skip
    return d


def test_save_writes_a_table_the_verdicts_follow_from(sweep_dir, checkout):
    written = R.save(sweep_dir, checkout)
    table_path = checkout / "results" / "toy" / "runs.csv"
    assert written == [checkout / "results" / "toy" / "claims.json", table_path]
    table = R.read_runs(table_path)
    assert len(table) == 10 and list(table.columns[:5]) == ["run", "stage", "arm", "seed", "status"]
    assert sorted(table["stage"].unique()) == ["final", "look2"]
    assert table.loc[table["run"] == "look2/6", "stage"].item() == "look2"
    # a number per claim read: the final accuracy, the time to target and whether censored
    assert {"final_accuracy", "time to test accuracy >= 0.8", "time to test accuracy >= 0.8"
            " censored", "cluster.num_workers"} <= set(table.columns)  # fmt: skip
    never = table[(table["cluster.num_workers"] == 4) & (table["seed"] == 1)].iloc[0]
    assert never["time to test accuracy >= 0.8 censored"] and never["status"] == "completed"
    diverged = table[table["status"] == "diverged"].iloc[0]
    assert np.isnan(diverged["final_accuracy"])  # unusable for it, as the evaluator says
    assert table["overrides"].str.contains("dataset.root=<local>").all()
    assert not table.to_csv().count("/home/")
    assert R.check_runs(checkout) == ([], [])


def test_check_names_the_claim_an_edited_value_changes(sweep_dir, checkout):
    R.save(sweep_dir, checkout)
    R.render(checkout)
    assert R.main(["--root", str(checkout), "--check"]) == 0
    path = checkout / "results" / "toy" / "runs.csv"
    table = R.read_runs(path)
    one = (table["cluster.num_workers"] == 1) & (table["seed"] == 0)
    table.loc[one, "final_accuracy"] = 0.5  # a reviewer's what-if: one seed far lower
    R.write_runs(path, table)
    problems, untabled = R.check_runs(checkout)
    assert untabled == []
    named = {line.split(": ")[1]: line for line in problems}
    # the claims that read the value, and the other test in its Holm family (its adjusted p)
    assert set(named) == {"claim one-ends-higher", "claim one-reproduces", "claim four-is-sooner"}
    higher = named["claim one-ends-higher"]
    assert "estimate 0.03218 in claims.json, -0.07542 from runs.csv" in higher
    assert "verdict holds in claims.json, inconclusive from runs" in named["claim one-reproduces"]
    assert named["claim four-is-sooner"].endswith(": p_holm 0.5652 in claims.json, 1 from runs.csv")
    assert R.main(["--root", str(checkout), "--check"]) == 1


def test_provenance_records_no_path_of_the_machine(sweep_dir, checkout):
    task = ["+sweep=toy", "dataset.root=/home/someone/data/mnist", "logger=none"]
    overrides = {"hydra": ["hydra.sweep.dir=/scratch/x"], "task": task}
    (sweep_dir / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": overrides}}))
    (path, _) = R.save(sweep_dir, checkout)
    prov = json.loads(path.read_text())["provenance"]
    assert prov["command"] == "stalebench -m +sweep=toy 'dataset.root=<local>' logger=none"
    assert prov["sweep_dir"] == "toy_abc1234"
    given = "stalebench -m +sweep=toy dataset.root=~/data/mnist"
    (path, _) = R.save(sweep_dir, checkout, given)
    assert json.loads(path.read_text())["provenance"]["command"] == (
        "stalebench -m +sweep=toy 'dataset.root=<local>'"
    )


def test_a_result_without_a_table_is_listed_not_failed(sweep_dir, checkout, capsys):
    R.save(sweep_dir, checkout)
    (checkout / "results" / "toy" / "runs.csv").unlink()
    R.render(checkout)
    assert R.check_runs(checkout) == ([], ["toy"])
    assert R.main(["--root", str(checkout), "--check"]) == 0
    err = capsys.readouterr().err
    assert "warning: results/toy/claims.json: no per-run table beside it (runs.csv)" in err


def test_the_committed_tables_give_the_committed_verdicts():
    """CI: each committed runs.csv judged again gives its claims.json's verdicts."""
    problems, _ = R.check_runs(ROOT)
    assert problems == []


def test_the_committed_provenance_names_no_machine_path():
    for path in sorted((ROOT / "results").glob("*/claims.json")):
        prov = json.loads(path.read_text()).get("provenance") or {}
        assert "/" not in str(prov.get("sweep_dir", "")), path
        assert R.portable_command(prov.get("command") or "") == (prov.get("command") or ""), path
