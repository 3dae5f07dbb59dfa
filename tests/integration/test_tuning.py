"""The tuning protocol end to end, through the `stalebench -m` command from outside the
checkout: a tiny tuned sweep (tuning_conf/test_sweep/tiny_tune.yaml, found through
hydra.searchpath: two arms, a 2-point learning-rate grid at one ratio with one point far too
small, 2 tuning seeds, 2 final seeds, in the simulator) tunes every arm on the validation
split only, extends each grid above its top edge (where the best is) until the point beyond
diverges, selects the better rate per arm, runs the final seeds with it, and a rerun
launches only what is not finished, extensions included. Bad tune blocks are refused by
key before any job starts; a run with eval.split=val never evaluates the test split.

Each command is a process of its own, forked by one driver process that imported the CLI,
torch, Hydra, the experiment and the report once (tests/cli_driver.py's `Command`): the
command's `main`, its arguments, working directory, stdout and stderr, and its exit code,
as the installed `stalebench` script runs them (tests/integration/test_sweeps.py runs that
script itself, from outside the checkout)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch
import yaml

from stalebench.metrics.events import read_events
from tests.cli_driver import SWEEP_IMPORTS, Command
from tests.conftest import compose
from tests.integration.test_run_dir_is_data import Payload

ROOT = Path(__file__).resolve().parents[2]
SEARCHPATH = f"hydra.searchpath=[file://{Path(__file__).parent / 'tuning_conf'}]"
TINY = ["-m", "+test_sweep=tiny_tune", SEARCHPATH, "hydra.sweep.dir=sweep"]
LR = "algorithm.update.lr"
# the good rate of each arm (asp: the sweep's grid, bsp: its own grid, good point first)
GOOD = {"asp": 0.2, "bsp": 0.4}
JOBLIB = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]

# what a command imports, imported once by the driver: a sweep's jobs, its tuning and
# report, joblib's launcher
IMPORTS = (*SWEEP_IMPORTS, "stalebench.runtime.sim", "stalebench.tuning",
           "hydra_plugins.hydra_joblib_launcher.joblib_launcher")  # fmt: skip


@pytest.fixture(scope="module")
def command():
    """`stalebench ARGS` in a directory (tests/cli_driver.py's `Command`), the driver's
    environment without PYTHONPATH: the commands import the installed stalebench."""
    with tempfile.TemporaryDirectory() as where:
        env = {**os.environ, "PYTHONPATH": ""}
        with Command(Path(where), env=env, imports=IMPORTS) as command:
            yield command


def config(run_dir: Path) -> dict:
    return yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())


def overrides(run_dir: Path) -> list[str]:
    return yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())


def splits_evaluated(run_dir: Path) -> set[str]:
    return {e["split"] for e in read_events(run_dir / "events.jsonl") if e["kind"] == "eval"}


def mtimes(root: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in root.rglob("summary.json")}


@pytest.fixture(scope="module")
def joblib_sweep(command, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """TINY, its jobs run by joblib's launcher in worker processes, 2 at a time: the command
    and its sweep directory, which the two tests below read (and never change)."""
    where = tmp_path_factory.mktemp("tuned")
    done = command([*TINY, *JOBLIB], where, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    return done, where / "sweep"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_tuning_stage_goes_through_hydras_launcher(joblib_sweep):
    """joblib runs the tuning and the final stage in worker processes: the layout, the
    selection and the final runs that test_a_tuned_sweep_selects_on_validation_data_and_resumes
    checks in full on this very sweep; Hydra's basic launcher runs the reruns there and the
    whole of test_the_second_stage_runs_seeds_only_for_the_claims_still_open."""
    done, sweep = joblib_sweep
    said = done.stderr + done.stdout
    assert "Joblib.Parallel(n_jobs=2" in said and "jobs locally" not in said  # joblib's own line
    assert len(list((sweep / "tune").rglob("summary.json"))) == 12  # 8 + 2 × 2 beyond
    cells = json.loads((sweep / "tuning.json").read_text())["cells"]
    assert [c["selected"] for c in cells] == [{LR: GOOD["asp"]}, {LR: GOOD["bsp"]}]
    assert sorted(p.parent.name for p in sweep.glob("*/summary.json")) == ["0", "1", "2", "3"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_tuned_sweep_selects_on_validation_data_and_resumes(command, joblib_sweep, tmp_path):
    """The sweep is `joblib_sweep`'s (its jobs run by joblib's launcher); the reruns, into a
    copy of its directory, are its command with Hydra's basic launcher: what a rerun
    launches is decided from the directory alone, whichever launcher ran it before."""
    sweep = joblib_sweep[1]

    # the tuning stage: 2 cells × 2 points × 2 seeds, then one point beyond each cell's top
    # edge (point 2: ×20000, the grid's own ratio), on the validation split only
    tuned = sorted(p.parent for p in (sweep / "tune").rglob("summary.json"))
    assert [p.relative_to(sweep).as_posix() for p in tuned] == [
        f"tune/{c}/{j}/{s}" for c in (0, 1) for j in (0, 1, 2) for s in (1000, 1001)
    ]
    for run_dir in tuned:
        summary = json.loads((run_dir / "summary.json").read_text())
        cfg = config(run_dir)
        beyond = run_dir.parent.name == "2"
        assert summary["status"] == ("diverged" if beyond else "completed")
        assert summary["eval_split"] == "val"
        assert summary["seed"] == int(run_dir.name) and cfg["seed"] == int(run_dir.name)
        assert (cfg["eval"]["split"], cfg["eval"]["validation_fraction"]) == ("val", 0.2)
        assert splits_evaluated(run_dir) == {"val"}  # the test split never

    # the selection: the better rate of each arm, with every candidate's score
    content = json.loads((sweep / "tuning.json").read_text())
    assert (content["seeds"], content["budget"], content["validation_fraction"]) == (
        [1000, 1001],
        4,
        0.2,
    )
    # each arm's realised points: its grid's 2 and the one beyond its edge
    assert (content["max_extensions"], content["points"]) == (4, {"asp": [3], "bsp": [3]})
    cells = content["cells"]
    assert [c["arm"] for c in cells] == ["asp", "bsp"]
    assert [c["selected"] for c in cells] == [{LR: GOOD["asp"]}, {LR: GOOD["bsp"]}]
    assert [c["selected_candidate"] for c in cells] == [1, 0]  # not the grid's position
    assert cells[1]["params"] == {LR: [0.4, 0.00002]}  # bsp's own grid, at the same ratio
    assert [(c["points"], c["budget"]) for c in cells] == [(3, 6), (3, 6)]
    for cell in cells:
        # the best was the top edge: one point above it, at the grid's ratio, diverged on
        # both tuning seeds, so the edge is interior by definition and the extension stops
        (added,) = cell["extension"]["added"]
        above = GOOD[cell["arm"]] * 20000
        assert added == {"candidate": 2, "key": LR, "side": "top", "values": {LR: above}}
        assert cell["extension"]["ratio"] == {LR: pytest.approx(20000)}
        assert (cell["extension"]["stopped"], cell["extension"]["at_edge"]) == ("diverged", [])
        assert "next" not in cell["extension"]
        good, bad, beyond = sorted(cell["candidates"], key=lambda c: c["rank"])
        assert good["standing"] == "reached" and good["score"] < bad["score"]
        assert beyond["values"] == {LR: above} and beyond["standing"] == "failed"
        assert {r["status"] for r in beyond["runs"]} == {"diverged"}
        assert [r["dir"] for r in good["runs"]] == [
            f"tune/{cell['cell']}/{good['candidate']}/{s}" for s in (1000, 1001)
        ]

    # the final stage: the sweep's seeds, in its usual directories, at the selected rate
    finals = sorted(p.parent for p in sweep.glob("*/summary.json"))
    assert [p.name for p in finals] == ["0", "1", "2", "3"]
    seen = []
    for run_dir in finals:
        cfg = config(run_dir)
        arm = cfg["algorithm"]["name"].lower()
        seen.append((arm, cfg["seed"]))
        assert cfg["algorithm"]["update"]["lr"] == GOOD[arm]
        assert cfg["sweep"]["tune"]["selected"] == {LR: GOOD[arm]}
        assert f"{LR}={GOOD[arm]}" in overrides(run_dir)
        assert cfg["eval"]["split"] == "test" and splits_evaluated(run_dir) == {"test"}
    assert seen == [("asp", 0), ("asp", 1), ("bsp", 0), ("bsp", 1)]
    # the report is the final stage's (the tuning stage is tuning.json's)
    assert "Runs: 4 (4 completed)" in (sweep / "report.md").read_text()

    # a rerun launches only what is not finished: here one tuning run, whose summary.json
    # is gone; the selection and the extension are made again from disk (the points
    # beyond the edges are finished: not launched again), the final runs are kept
    sweep = tmp_path / "sweep"
    shutil.copytree(joblib_sweep[1], sweep, symlinks=True)
    before = mtimes(sweep)
    lost = sweep / "tune" / "1" / "1" / "1001" / "summary.json"
    lost.unlink()
    again = command(TINY, tmp_path, timeout=280)
    assert again.returncode == 0, again.stderr[-3000:]
    after = mtimes(sweep)
    assert {p for p in after if after[p] != before.get(p)} == {lost}
    assert "tuning stage: 7 of 8 jobs finished before" in again.stderr + again.stdout
    assert "tuning extension 1 stage: 4 of 4 jobs finished before" in again.stderr + again.stdout
    assert "final stage: 4 of 4 jobs finished before" in again.stderr + again.stdout
    assert json.loads((sweep / "tuning.json").read_text())["cells"][1]["selected"] == {
        LR: GOOD["bsp"]
    }

    # a sweep directory handed over to "finish it" is data, never code: a final job whose
    # summary is gone and whose checkpoint names code (as a crafted file could) is refused
    # by name when the sweep's command runs again (its sweeper adds resume=true), and the
    # code never runs
    job = sweep / "3"
    sha = json.loads((job / "summary.json").read_text())["config_sha"]
    (job / "summary.json").unlink()
    (job / "checkpoint").mkdir()
    (job / "checkpoint" / "config.json").write_text(json.dumps({"config_sha": sha}))
    marker = tmp_path / "MARKER"
    torch.save({"config_sha": sha, "state": Payload(marker)}, job / "checkpoint" / "state.pt")
    events = (job / "events.jsonl").read_bytes()
    planted = command(TINY, tmp_path, timeout=280)
    assert planted.returncode != 0 and not marker.exists()
    assert f"resume=true: {job / 'checkpoint' / 'state.pt'}: not loaded: it names" in (
        planted.stderr
    )
    assert (job / "events.jsonl").read_bytes() == events


BAD_TUNE = [
    ("seed=1,1000", "sweep.tune.seeds"),
    ("sweep.tune.validation_fraction=0.7", "sweep.tune.validation_fraction"),
    ("++sweep.tune.arms.bsp={algorithm.update.lr:[0.4]}", "sweep.tune.arms.bsp"),
    ("++sweep.tune.arms.sgd={algorithm.update.lr:[0.4,0.1]}", "sweep.tune.arms.sgd"),
    # bsp's grid at ×4 against asp's at ×20000: one resolution for every arm
    ("++sweep.tune.arms.bsp={algorithm.update.lr:[0.4,0.1]}", "asp x20000; bsp x4"),
    ("sweep.tune.max_extensions=-1", "sweep.tune.max_extensions"),
]


@pytest.fixture(scope="module")
def refused(command, tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """TINY with each bad tune block, each in a folder of its own, two at a time: override
    -> the command and its folder."""
    runs = [([*TINY, override], tmp_path_factory.mktemp("refused")) for override, _ in BAD_TUNE]
    done = command.many(runs, timeout=110, at_once=2)
    return {o: (d, w) for (o, _), d, (_, w) in zip(BAD_TUNE, done, runs, strict=True)}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("override, key", BAD_TUNE)
def test_a_bad_tune_block_is_refused_by_key_before_any_job(refused, override, key):
    done, tmp_path = refused[override]
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("stalebench: error:")]
    assert key in line
    assert not (tmp_path / "sweep" / "tune").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_tuned_key_the_command_line_sets_is_not_tuned(command, tmp_path):
    """The command line wins: with the only tuned key pinned, nothing is left to tune and
    the sweep runs as Hydra's basic sweeper runs it."""
    done = command([*TINY, f"{LR}=0.3"], tmp_path, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "algorithm.update.lr is set by the sweep's overrides" in done.stderr + done.stdout
    sweep = tmp_path / "sweep"
    assert not (sweep / "tune").exists() and not (sweep / "tuning.json").exists()
    finals = sorted(p.parent for p in sweep.glob("*/summary.json"))
    assert [p.name for p in finals] == ["0", "1", "2", "3"]
    for run_dir in finals:
        cfg = config(run_dir)
        assert cfg["algorithm"]["update"]["lr"] == 0.3 and cfg["sweep"]["tune"]["selected"] == {}
        assert f"{LR}=0.3" in overrides(run_dir)


@pytest.mark.timeout(120)
def test_a_run_on_the_validation_split_never_evaluates_the_test_split(tmp_path):
    from stalebench import experiment

    cfg = compose(
        ["runtime=sim", "dataset=synthetic", "model=logreg", "cluster=homogeneous"]
        + ["cluster.num_workers=2", "budget.max_wall_s=1", "eval.every_s=0.25"]
        + ["eval.train_samples=50", "eval.split=val", "eval.validation_fraction=0.3"]
    )
    cfg.run_dir = str(tmp_path)
    summary = experiment.run(cfg)
    events = read_events(tmp_path / "events.jsonl")
    evals = [e for e in events if e["kind"] == "eval"]
    assert {e["split"] for e in evals} == {"val", "train"}
    assert summary["status"] == "completed" and summary["eval_split"] == "val"
    assert summary["final"]["loss"] == [e for e in evals if e["split"] == "val"][-1]["loss"]


def test_the_stalebench_sweeper_is_the_default_and_hydra_finds_it():
    from hydra.core.plugins import Plugins
    from hydra.plugins.sweeper import Sweeper

    names = {cls.__module__ + "." + cls.__name__ for cls in Plugins.instance().discover(Sweeper)}
    assert "hydra_plugins.stalebench_sweeper.sweeper.TuningSweeper" in names
    text = (ROOT / "conf" / "config.yaml").read_text()
    assert "override hydra/sweeper: stalebench" in text


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_second_stage_runs_seeds_only_for_the_claims_still_open(command, tmp_path):
    """tiny_looks: at the sweep's 2 seeds the paper claim is short of its 3 (inconclusive),
    the self-check holds; look 2 runs seed 2 for the claim's two arms (with their tuned
    rates), and looks go on, one seed each, while it is open, up to 4 seeds. Its tuning
    stage is at its least that selects (one tuning seed, no extension: tiny_looks.yaml);
    Hydra's basic launcher runs it all."""
    args = ["-m", "+test_sweep=tiny_looks", SEARCHPATH, "hydra.sweep.dir=sweep"]
    done = command(args, tmp_path, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    sweep = tmp_path / "sweep"
    verdicts = {c["id"]: c for c in json.loads((sweep / "claims.json").read_text())["claims"]}
    check, claim = verdicts["two-workers"], verdicts["asp-lower-loss"]
    # both seeds ran 2 workers: bit-identical values are one measurement, said as a caveat
    assert (check["verdict"], check["look"], check["n"]) == ("holds", 1, 1)
    assert check["caveats"] == ["one measurement"]
    assert check["alpha"] == 0.025 and check["looks"] == 3
    assert claim["look"] in (2, 3) and claim["n"] == 1 + claim["look"]
    assert claim["alpha"] == pytest.approx(0.0125) and claim["mde"] is not None
    looks = sorted(
        p.parent.relative_to(sweep).as_posix() for p in sweep.glob("look*/*/*/summary.json")
    )
    expected = [f"look{k}/{c}/{k}" for k in range(2, claim["look"] + 1) for c in (0, 1)]
    assert looks == expected
    for path in looks:
        cfg = config(sweep / path)
        arm = cfg["algorithm"]["name"].lower()
        assert cfg["sweep"]["look"] == int(path[4]) and cfg["seed"] == int(path.rsplit("/")[-1])
        assert cfg["algorithm"]["update"]["lr"] == GOOD[arm]  # the cell's selection
    assert "Look 2 of 3: 2 cells x seeds [2]" in done.stderr + done.stdout
    # a rerun judges again from disk: the claim is decided or at its last look, so no look
    # is launched, and nothing is run again
    before = mtimes(sweep)
    again = command(args, tmp_path, timeout=280)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "final stage: 4 of 4 jobs finished before" in again.stderr + again.stdout
    assert "Look " not in again.stderr + again.stdout
    assert {p for p, t in mtimes(sweep).items() if before.get(p) != t} == set()
