"""The W&B sink end to end, offline: what the run logged, read back from its .wandb file,
matches events.jsonl; multirun jobs are separate runs in one group; a broken W&B never
fails the run.

Every command runs once, in one driver process that forks a child per command
(tests/cli_driver.py: torch and Hydra imported once; W&B imported by each
command itself, so each starts its own W&B service, as a command does); each test asserts
on the command it is about (`ran`)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from pathlib import Path

import pytest

from stalebench.metrics.events import read_events
from tests.cli_driver import SWEEP_IMPORTS, case, drive
from tests.conftest import TINY_DSSP_SWEEP, free_port
from tests.wandb_log import read_run

# the first test runs every command (`ran`): at most 150 s each, as a command's own
# timeout was, two at a time
pytestmark = pytest.mark.timeout(900)

FAST = [
    "runtime=sim",
    "dataset=synthetic",
    "model=mlp",
    "model.hidden=[32]",
    "cluster.compute_ms=5",
    "budget.max_wall_s=0",
    "budget.max_updates=120",
    "eval.every_s=0",
    "eval.every_updates=30",
    "sim.batch=off",  # one gradient at a time: at 4 workers, batches cost more than they save
]


# the environment of every command: without WANDB_MODE, and without WANDB_SERVICE, which
# wandb sets in a process that used it (an earlier in-process test): a child inheriting it
# attaches to that process's service instead of its own, and its offline files may not be
# on disk when the child exits
ENV = {
    k: v
    for k, v in os.environ.items()
    if k not in ("WANDB_MODE", "WANDB_SERVICE", "WANDB_API_KEY", "WANDB_BASE_URL")
}


def stalebench(case_id, tmp, args, env=None, **kw):
    """A command for the driver (tests/cli_driver.py): `stalebench args` in
    a folder of its own under `tmp`, with W&B's directories in it."""
    cwd = tmp / case_id
    where = {"WANDB_DIR": str(cwd), "WANDB_CACHE_DIR": str(cwd / "cache"),
             "WANDB_CONFIG_DIR": str(cwd / "config")}  # fmt: skip
    return case(case_id, cwd, args, env={**where, **(env or {})}, **kw)


def offline_runs(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("wandb/offline-run-*/*.wandb"))


BREAK_WANDB = """
import wandb.sdk.wandb_run as wandb_run
calls = [0]
log = wandb_run.Run.log
def failing_log(self, *args, **kwargs):
    calls[0] += 1
    if {fail_log} and calls[0] > 2:
        raise RuntimeError("W&B lost its connection")
    return log(self, *args, **kwargs)
def failing_finish(self, *args, **kwargs):
    raise RuntimeError("W&B could not finish")
wandb_run.Run.log = failing_log
if {fail_finish}:
    wandb_run.Run.finish = failing_finish
"""

FAILING = [(True, False, "W&B lost its connection"), (False, True, "W&B could not finish")]
MODES = [
    ("auto", "disabled", False, None),  # WANDB_MODE is honoured
    ("offline", "disabled", True, "W&B logs offline (logger.wandb_mode=offline), not as "
     "WANDB_MODE=disabled says"),  # a mode set in the config wins, and says so
]  # fmt: skip
SWEEP = ["-m", "logger=wandb", "algorithm=bsp,asp", "hydra.sweep.dir=sweep", *FAST]
PINNED = ["algorithm.update.lr=0.1", "sweep.sequential.max_seeds=0"]


@contextlib.contextmanager
def answering_host():
    """A host that answers: it takes every connection and closes it. (One that never took
    them would hold the command at its exit: W&B's telemetry exporters wait ~10 s for it.)"""
    with socket.create_server(("127.0.0.1", 0)) as server:

        def serve():
            with contextlib.suppress(OSError):  # the server closed
                while True:
                    server.accept()[0].close()

        threading.Thread(target=serve, daemon=True).start()
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """Every command of this file, run once: case id -> the case, its exit code, stdout,
    stderr and seconds (tests/cli_driver.py)."""
    tmp = tmp_path_factory.mktemp("wandb")
    fake = tmp / "fake"
    (fake / "wandb").mkdir(parents=True)
    (fake / "wandb" / "__init__.py").write_text("raise RuntimeError('W&B is broken here')\n")
    port = free_port()  # nothing listens there once it is closed
    cases = [  # the longest first: two at a time, the short ones fill in
        # the verdicts' logging is the subject: the least stages a sweep can have (the rate
        # pinned: no tuning stage; no second stage of seeds)
        stalebench("paper", tmp, [*TINY_DSSP_SWEEP, *PINNED, "logger=wandb"]),
        stalebench("history", tmp, ["logger=wandb", "algorithm=ssp", "hydra.run.dir=run", *FAST]),
        # a multirun's jobs, online with the host unreachable: it logs offline, each job a
        # run of one group (test_multirun_jobs_are_separate_runs_in_one_group and
        # test_an_unreachable_host_is_checked_once_per_sweep_and_it_logs_offline)
        stalebench("sweep", tmp, SWEEP, env={"WANDB_MODE": "online",
                                             "WANDB_BASE_URL": f"http://127.0.0.1:{port}"}),
        stalebench("broken", tmp, ["logger=wandb", "hydra.run.dir=run", *FAST],
                   env={"PYTHONPATH": str(fake)}, path=(str(fake),)),
        *[stalebench(f"failing-{fail_log}-{fail_finish}", tmp,
                     ["logger=wandb", "hydra.run.dir=run", *FAST],
                     before=BREAK_WANDB.format(fail_log=fail_log, fail_finish=fail_finish))
          for fail_log, fail_finish, _ in FAILING],
        *[stalebench(f"mode-{configured}-{env_mode}", tmp,
                     ["logger=wandb", f"logger.wandb_mode={configured}", "hydra.run.dir=run",
                      *FAST], env={"WANDB_MODE": env_mode})
          for configured, env_mode, _, _ in MODES],
    ]  # fmt: skip
    # the host answers (a socket that listens), but there is no API key: W&B refuses to
    # start online
    with answering_host() as host:
        env = {"WANDB_MODE": "online", "WANDB_BASE_URL": host}
        cases.append(stalebench("online-refused", tmp, ["logger=wandb", "hydra.run.dir=run",
                                                         *FAST], env=env))  # fmt: skip
        out = drive(cases, ENV, at_once=2, imports=SWEEP_IMPORTS)
    for c in out.values():
        c["port"] = port
    return out


def test_offline_run_history_matches_the_events(ran):
    done = ran["history"]
    assert done["code"] == 0, done["stderr"]
    run_dir = Path(done["cwd"]) / "run"
    (log,) = offline_runs(run_dir)
    logged = read_run(log)
    assert logged["run"].job_type == "ssp"
    config = {item.key: json.loads(item.value_json) for item in logged["run"].config.update}
    assert config["algorithm"]["barrier"]["staleness"] == 3  # the resolved config
    events = read_events(run_dir / "events.jsonl")
    evals = [
        (e["t"], e["accuracy"]) for e in events if e["kind"] == "eval" and e["split"] == "test"
    ]
    rows = [
        (h["time/simulated_s"], h["test/accuracy"])
        for h in logged["history"]
        if "test/accuracy" in h
    ]
    assert rows == evals  # same floats: both come from one JSON round trip
    train = [h for h in logged["history"] if "train/batch_loss" in h]
    assert train and train[-1]["sys/updates"] == 120
    ups = [e for e in events if e["kind"] == "update"]
    assert max(h["time/simulated_s"] for h in train) == pytest.approx(ups[-1]["t"])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert logged["summary"]["status"] == "completed"
    assert logged["summary"]["updates"] == summary["updates"]
    # where the offline run is, and the command that uploads it
    assert f"upload it with: wandb sync {log.parent}\n" in done["stdout"], done["stdout"]


def test_multirun_jobs_are_separate_runs_in_one_group(ran):
    done = ran["sweep"]
    tmp_path = Path(done["cwd"])
    assert done["code"] == 0, done["stderr"]
    runs = [read_run(p) for p in sorted(tmp_path.glob("sweep/*/wandb/offline-run-*/*.wandb"))]
    assert len(runs) == 2
    assert {r["run"].job_type for r in runs} == {"bsp", "asp"}
    assert len({r["run"].run_group for r in runs}) == 1 and runs[0]["run"].run_group
    assert len({r["run"].run_id for r in runs}) == 2
    sync = [line for line in done["stdout"].splitlines() if "wandb sync" in line]
    assert sync == [  # once, at the sweep's end
        f"W&B: 2 offline runs under {tmp_path / 'sweep'}; upload them with: "
        f"wandb sync {tmp_path / 'sweep'}/*/wandb/offline-run-*"
    ]


def test_a_broken_wandb_never_fails_the_run(ran):
    done = ran["broken"]
    assert done["code"] == 0, done["stderr"]
    assert "W&B not started: W&B is broken here" in done["stderr"]
    summary = json.loads((Path(done["cwd"]) / "run" / "summary.json").read_text())
    assert summary["status"] == "completed"


def test_a_paper_sweep_logs_its_verdicts_to_wandb_in_the_papers_group(ran):
    done = ran["paper"]
    tmp_path = Path(done["cwd"])
    assert done["code"] == 0, done["stderr"]
    runs = [read_run(p) for p in sorted(tmp_path.glob("sweep/*/wandb/offline-run-*/*.wandb"))]
    assert len(runs) == 4 and {r["run"].run_group for r in runs} == {"dssp"}
    (claims,) = [read_run(p) for p in tmp_path.glob("sweep/wandb/offline-run-*/*.wandb")]
    assert claims["run"].run_group == "dssp" and claims["run"].job_type == "claims"
    verdicts = json.loads((tmp_path / "sweep" / "claims.json").read_text())["claims"]
    logged = {k: v for k, v in claims["summary"].items() if k.startswith("verdict/")}
    assert logged == {
        f"verdict/{v['id']}" + (f"[{v['scope']}]" if v["scope"] else ""): v["verdict"]
        for v in verdicts
    }


@pytest.mark.parametrize("fail_log, fail_finish, warning", FAILING)
def test_wandb_failing_after_init_never_fails_the_run(ran, fail_log, fail_finish, warning):
    """W&B started, then its `log` (mid-run) or its `finish` (at the end) raises: the run
    completes, the sink is switched off with one warning, and the run directory is whole."""
    done = ran[f"failing-{fail_log}-{fail_finish}"]
    tmp_path = Path(done["cwd"])
    assert done["code"] == 0, done["stderr"][-3000:]
    assert f"stalebench: warning: Wandb switched off: {warning}" in done["stderr"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["status"], summary["updates"]) == ("completed", 120)
    events = read_events(tmp_path / "run" / "events.jsonl")
    assert events[-1]["kind"] in ("eval", "system")
    assert any(e["kind"] == "system" and e["event"] == "end" for e in events)


@pytest.mark.parametrize("configured, env_mode, logged, said", MODES)
def test_wandb_mode_is_honoured_unless_the_config_sets_one(ran, configured, env_mode, logged, said):
    done = ran[f"mode-{configured}-{env_mode}"]
    assert done["code"] == 0, done["stderr"]
    assert bool(offline_runs(Path(done["cwd"]) / "run")) == logged
    stderr = done["stderr"]
    assert (f"stalebench: {said}\n" in stderr) if said else "WANDB_MODE" not in stderr


def test_an_unreachable_host_is_checked_once_per_sweep_and_it_logs_offline(ran):
    done = ran["sweep"]
    port = done["port"]
    assert done["code"] == 0, done["stderr"]
    off = [line for line in done["stderr"].splitlines() if "W&B online logging is off" in line]
    assert off == [
        f"stalebench: warning: W&B online logging is off: 127.0.0.1:{port} cannot be reached "
        "(Connection refused); it logs offline, for the whole sweep"
    ]
    assert len(list((Path(done["cwd"]) / "sweep").glob("*/wandb/offline-run-*/*.wandb"))) == 2
    assert "upload them with: wandb sync" in done["stdout"]
    assert done["took"] < 120, done["took"]  # never W&B's 60 s init timeout per run


def test_a_failed_online_start_falls_back_to_offline_with_one_line(ran):
    done = ran["online-refused"]
    stderr = done["stderr"]
    assert done["code"] == 0, stderr
    lines = [line for line in stderr.splitlines() if "did not start online" in line]
    assert len(lines) == 1 and lines[0].startswith(
        "stalebench: warning: W&B did not start online (UsageError: "
    ), stderr
    assert lines[0].endswith("); it logs offline")
    (log,) = offline_runs(Path(done["cwd"]) / "run")
    assert read_run(log)["summary"]["status"] == "completed"
    assert f"upload it with: wandb sync {log.parent}" in done["stdout"]
