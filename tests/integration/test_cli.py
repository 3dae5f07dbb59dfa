"""The `stalebench` command end to end, in subprocesses: the default job (its 20 s beside
the other tests: `default_job`), a Hydra multirun, torchrun (its ranks with an out-of-tree
plugin), a worker killed mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stalebench.metrics.events import read_events
from tests.conftest import processes_left

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FAST = [
    "dataset=synthetic",
    "model=mlp",
    "model.hidden=[32]",
    "cluster.compute_ms=5",
    "eval.every_s=0",
    "eval.every_updates=20",
    "oversubscribe=true",  # as tests/conftest.py's FAST: the pace is not what these test
    "sim.batch=off",  # one gradient at a time: at 4 workers, batches cost more than they save
    "budget.max_wall_s=0",  # last: FAST[:-1] runs by wall time
]


def stalebench(args, cwd, timeout, env=None, runner=("-m", "stalebench.cli")):
    return subprocess.run(
        [sys.executable, *runner, *args],
        cwd=cwd,
        timeout=timeout,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )


def summaries(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(root.rglob("summary.json"))]


DEFAULT_JOB = "test_no_arguments_runs_the_default_ssp_job"


@pytest.fixture(scope="module", autouse=True)
def default_job(request, tmp_path_factory):
    """`stalebench` with no arguments, started with this module's first test and checked by
    test_no_arguments_runs_the_default_ssp_job, its last: the job's 20 s of wall clock, in
    which its workers mostly wait out the profile's compute time (a fraction of one core),
    pass beside the other tests' runs. Started only if that test is to run; stopped at the
    module's end if it did not wait for it."""
    if not any(item.name == DEFAULT_JOB for item in request.session.items):
        yield None
        return
    cwd, out = tmp_path_factory.mktemp("default"), tmp_path_factory.mktemp("default-out")
    with open(out / "stdout", "w") as stdout, open(out / "stderr", "w") as stderr:
        job = subprocess.Popen([sys.executable, "-m", "stalebench.cli"], cwd=cwd, stdout=stdout,
                               stderr=stderr, env=dict(os.environ))  # fmt: skip
    started = time.monotonic()
    try:
        yield job, started, cwd, out
    finally:
        if job.poll() is None:  # its test did not wait for it to end: it stops
            job.send_signal(signal.SIGTERM)
            try:
                job.wait(timeout=30)
            except subprocess.TimeoutExpired:
                job.kill()
                job.wait()


@pytest.mark.timeout(240)
def test_multirun_gives_each_job_its_directory_and_every_algorithm_learns(tmp_path):
    args = [
        "-m",
        "algorithm=bsp,asp,ssp",
        "seed=0,1",
        "dataset=mnist1d",
        "model=mlp",
        "budget.max_wall_s=0",
        "budget.max_updates=150",
        "eval.every_s=0",
        "eval.every_updates=50",
        "cluster=homogeneous",
        "cluster.num_workers=2",
        "cluster.compute_ms=2",
        "hydra.sweep.dir=sweep",
    ]
    done = stalebench(args, tmp_path, timeout=230)
    assert done.returncode == 0, done.stderr
    dirs = sorted(p.parent for p in (tmp_path / "sweep").rglob("summary.json"))
    assert len(dirs) == 6 and len({d.name for d in dirs}) == 6
    seen = set()
    for d in dirs:
        summary = json.loads((d / "summary.json").read_text())
        assert summary["status"] == "completed", summary["error"]
        seen.add((summary["algorithm"], summary["seed"]))
        tests = [
            e
            for e in read_events(d / "events.jsonl")
            if e["kind"] == "eval" and e["split"] == "test"
        ]
        first, last = min(tests, key=lambda e: e["version"]), max(tests, key=lambda e: e["version"])
        assert last["loss"] < first["loss"] - 0.1, (summary["algorithm"], first, last)
        assert last["accuracy"] > first["accuracy"] + 0.1, (summary["algorithm"], first, last)
    assert seen == {(a, s) for a in ("bsp", "asp", "ssp") for s in (0, 1)}
    # the multirun callback wrote the sweep's report
    report = (tmp_path / "sweep" / "report.md").read_text()
    assert "| bsp |" in report and "| asp |" in report and "| ssp |" in report
    assert len(list((tmp_path / "sweep" / "figures").glob("*.png"))) == 4


def torchrun(tmp_path: Path, nproc: int, args: list[str], env=None) -> None:
    """`torchrun --standalone --nproc-per-node nproc -m stalebench.cli args` in tmp_path."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            "-m",
            "stalebench.cli",
            *args,
        ],
        cwd=tmp_path,
        timeout=110,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def plugin_under_torchrun(tmp_path_factory) -> Path:
    """One sweep for two tests: torchrun's 3 ranks (a server and 2 workers), each a
    `stalebench` process of its own, with examples/plugin's update rule, which each finds
    through its entry point, over two seeds (`-m`: the same processes run each job). Made
    importable as an installed distribution: a dist-info directory with its entry point, on
    PYTHONPATH (what `pip install` would write). Their temporary files under TMPDIR."""
    tmp_path = tmp_path_factory.mktemp("torchrun")
    site = tmp_path / "site"
    info = site / "stalebench_signsgd-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: stalebench-signsgd\nVersion: 0.1.0\n"
    )
    (info / "entry_points.txt").write_text("[stalebench.plugins]\nsignsgd = stalebench_signsgd\n")
    pythonpath = os.pathsep.join([str(site), str(ROOT / "examples" / "plugin")])
    args = [
        "-m",  # before the overrides (Hydra's command line)
        "algorithm=asp",
        "algorithm/update=signsgd",
        "algorithm.update.lr=0.01",
        "cluster.num_workers=2",
        "budget.max_updates=40",
        *FAST,
        "seed=0,1",
        "hydra.sweep.dir=sweep",
    ]
    run, scratch = tmp_path / "run", tmp_path / "tmp"
    run.mkdir()
    scratch.mkdir()
    torchrun(run, 3, args, env={"PYTHONPATH": pythonpath, "TMPDIR": str(scratch)})
    assert not list(scratch.glob("stalebench-*"))  # each rank's scratch sweep dir removed
    assert not processes_left(tmp_path)
    return run


@pytest.mark.timeout(120)
def test_torchrun_ranks_share_one_run_directory_per_job_of_a_sweep(plugin_under_torchrun):
    """Each job of the sweep meets in its own part of torchrun's store and forms its own
    process group: both complete, their summaries with every rank's counts and place;
    ranks > 0 make no directory or file of their own."""
    tmp_path = plugin_under_torchrun
    assert [(s["status"], s["updates"], s["seed"]) for s in summaries(tmp_path)] == [
        ("completed", 40, 0), ("completed", 40, 1)
    ]  # fmt: skip
    for summary in summaries(tmp_path):  # every rank's counts, as under the spawn launcher
        assert summary["overrun"]["steps"] >= 40 and summary["hub"]["messages"] >= 40
        assert summary["cycle"]["steps"] > 0
        assert [r["rank"] for r in summary["ranks"]] == [0, 1, 2]
    run_dirs = sorted(
        p.relative_to(tmp_path)
        for p in tmp_path.rglob("*")
        if p.is_dir() and p.name != ".hydra" and (p / ".hydra").exists()
    )
    assert run_dirs == [Path("sweep/0"), Path("sweep/1")]  # none of ranks > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep"]
    assert (tmp_path / "sweep" / "report.md").is_file()
    for run_dir in run_dirs:
        logs = sorted(p.name for p in (tmp_path / run_dir / "logs").iterdir())
        assert logs == ["rank-0.log", "rank-1.log", "rank-2.log"]


def _pids(run_dir: Path) -> dict[int, int]:
    pids = {}
    for log in (run_dir / "logs").glob("rank-*.log"):
        for line in log.read_text().splitlines():
            if "process group ready" in line:
                pids[int(log.stem.split("-")[1])] = int(line.split("(pid ")[1].split(")")[0])
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not a process left behind
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def kill_mid_run(tmp_path: Path, run_dir: Path, args: list[str], world: int, rank: int):
    """Start `stalebench args`, wait until all `world` ranks run and updates flow, SIGKILL
    `rank`; returns the ranks' pids and the seconds from the kill to the CLI's exit."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "stalebench.cli", *args, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pids = _pids(run_dir) if (run_dir / "logs").exists() else {}
            updates = [e for e in read_events(run_dir / "events.jsonl") if e["kind"] == "update"]
            if len(pids) == world and len(updates) > 20:
                break
            time.sleep(0.2)
        else:
            pytest.fail("the run did not start")
        killed_at = time.monotonic()
        os.kill(pids[rank], signal.SIGKILL)
        proc.communicate(timeout=60)
        return pids, time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.timeout(120)
def test_a_killed_worker_fails_the_run_and_leaves_no_process(tmp_path):
    run_dir = tmp_path / "run"
    args = ["algorithm=ssp", "budget.max_wall_s=60", "timeout_s=10", *FAST[:-1]]
    pids, ended_after = kill_mid_run(tmp_path, run_dir, args, world=5, rank=2)  # worker 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert "worker 1 (rank 2)" in summary["error"]
    assert ended_after < 30, ended_after  # within the 10 s timeout plus shutdown
    assert not [r for r, pid in pids.items() if _alive(pid)]
    assert read_events(run_dir / "events.jsonl")[-1]["kind"] in ("eval", "system")


@pytest.mark.timeout(120)
def test_a_killed_server_fails_the_run_and_leaves_no_process(tmp_path):
    """Rank 0 owns the run directory: when it is killed, the supervisor writes summary.json
    from the events, names the server and the signal, and stops the workers."""
    run_dir = tmp_path / "run"
    args = ["algorithm=asp", "budget.max_wall_s=60", "timeout_s=10", *FAST[:-1]]
    pids, ended_after = kill_mid_run(tmp_path, run_dir, args, world=5, rank=0)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["error"].startswith("server (rank 0) exited with signal SIGKILL"), summary
    assert summary["updates"] > 20  # what the events recorded before the kill
    assert ended_after < 30, ended_after
    assert not [r for r, pid in pids.items() if _alive(pid)]


@pytest.mark.timeout(120)
def test_out_of_tree_plugin_is_found_through_entry_points(plugin_under_torchrun):
    summary = summaries(plugin_under_torchrun)[0]
    assert summary["status"] == "completed"
    assert (summary["update_rule"], summary["algorithm"]) == ("signsgd", "asp+signsgd")
    run_dir = next(plugin_under_torchrun.rglob("summary.json")).parent
    tests = [
        e
        for e in read_events(run_dir / "events.jsonl")
        if e["kind"] == "eval" and e["split"] == "train"
    ]
    assert tests[-1]["loss"] < tests[0]["loss"]


@pytest.mark.timeout(120)
def test_no_arguments_runs_the_default_ssp_job(default_job):
    """Last in this module: the job started with its first test (`default_job`)."""
    job, started, tmp_path, out = default_job
    job.wait(timeout=max(1.0, 110 - (time.monotonic() - started)))  # as a command's timeout
    stdout, stderr = (out / "stdout").read_text(), (out / "stderr").read_text()
    assert job.returncode == 0, stderr
    (summary,) = summaries(tmp_path / "outputs")
    assert summary["status"] == "completed"
    assert (summary["algorithm"], summary["runtime"], summary["num_workers"]) == ("ssp", "real", 4)
    assert summary["cluster"] == "heterogeneous"
    run_dir = next((tmp_path / "outputs").rglob("summary.json")).parent
    config = (run_dir / ".hydra" / "config.yaml").read_text()
    assert "slow_factor_max: 3" in config and "staleness: 3" in config
    assert summary["final"]["accuracy"] > 0.3
    assert "[completed] ssp" in stdout
