"""Bad input on the command line: exit code 2, one line on stderr naming the config key and
the bad value, nothing on stdout, and no process started (no per-rank logs/ anywhere).

Each case is the `stalebench` command in a process of its own, forked by one driver process
that imported the CLI (and torch, Hydra and the experiment) once (tests/cli_driver.py), its
stdout and stderr in files outside its working directory."""

from __future__ import annotations

import io
import json
import os
import random
from pathlib import Path

import pytest
import torch

from stalebench.job import config_sha
from tests.cli_driver import Driver, case
from tests.conftest import compose

# a simulated run (no process is started before its checkpoint is read)
RESUME = ["runtime=sim", "dataset=synthetic", "model=mlp", "model.hidden=[8]",
          "cluster.num_workers=2", "resume=true", "hydra.run.dir={tmp}/run"]  # fmt: skip

# (arguments, config key, bad value); "{tmp}" stands for the test's temporary directory,
# "{sha}" for the config_sha of the case's config.
# A case per way the CLI meets bad input (a group choice, a value, a multirun, a file, the
# model × data check, an engine's check, a sweep): every other refused value is checked in
# process by test_validation_paths.py.
CASES = [
    (["algorithm=foo"], "algorithm", "foo"),
    (["algorithm.barrier.staleness=-1"], "algorithm.barrier.staleness", "-1"),
    (["dataset=mnist", "dataset.root={tmp}/nope"], "dataset.root", "{tmp}/nope"),
    (["-m", "algorithm=bsp,nope"], "algorithm", "nope"),
    (["algorithm=nesterov_pp", "algorithm.pipeline.stages=8"], "algorithm.pipeline.stages", "8"),
    (["algorithm=pipedream", "dataset.path={tmp}/nope.txt"], "dataset.path", "{tmp}/nope.txt"),
    (["algorithm=nesterov_pp", "engine=ps"], "engine", "ps"),
    (["engine=allreduce", "algorithm=bsp", "server_device=cuda"], "server_device", "cuda"),
    (["algorithm/optimizer=foo"], "algorithm/optimizer", "foo"),
    (["model=resnet20"], "model=resnet20", "(40,)"),
    (["dataset=cifar10", "dataset.root={tmp}/nope"], "dataset.root", "{tmp}/nope"),
    (["-m", "+sweep=nope"], "sweep", "nope"),
    (["+sweep=dssp", "sweep.scale=huge"], "sweep.scale", "huge"),
    # a value of the wrong type: the type expected, named before Hydra composes
    (["cluster.num_workers=four"], "cluster.num_workers", "an integer, got 'four'"),
    (["budget.max_wall_s=abc"], "budget.max_wall_s", "a number, got 'abc'"),
    (["seed=1.5"], "seed", "an integer, got 1.5"),
    (["-m", "seed=0,1.5"], "seed", "an integer, got 1.5"),
    (["oversubscribe=maybe"], "oversubscribe", "true or false, got 'maybe'"),
    # resume=true from a checkpoint that cannot be gone on from (`PLANTED`): in the
    # project's words, never torch's
    (RESUME, "resume=true", "{tmp}/run/checkpoint/state.pt: not loaded: not a stalebench "
     "checkpoint (not a torch.save archive)"),
    (RESUME, "resume=true", "{tmp}/run/checkpoint/state.pt: not loaded: the file is truncated"),
    (RESUME, "resume=true", "{tmp}/run/checkpoint/state.pt: from another config: its "
     "config_sha is 0123456789abcdef, its config.json's {sha}"),
    (RESUME, "resume=true", "{tmp}/run/checkpoint/state.pt: not loaded: it names "),
]  # fmt: skip


IDS = [
    "unknown-algorithm",
    "negative-staleness",
    "missing-mnist-root",
    "multirun-unknown-algorithm",
    "pipeline-more-stages-than-layers",
    "missing-text-file",
    "pipeline-algorithm-on-ps",
    "server-device-without-a-server",
    "unknown-optimizer",
    "model-that-cannot-read-the-inputs",
    "missing-cifar-root",
    "unknown-sweep",
    "bad-sweep-scale",
    "workers-not-an-integer",
    "wall-time-not-a-number",
    "seed-a-float",
    "multirun-seed-a-float",
    "bool-not-a-bool",
    "checkpoint-of-random-bytes",
    "checkpoint-truncated",
    "checkpoint-of-another-config",
    "checkpoint-torch-refuses",
]

# the checkpoint each resume=true case finds in its run directory, beside a config.json that
# names the run's config
PLANTED = {
    "checkpoint-of-random-bytes": "random",
    "checkpoint-truncated": "truncated",
    "checkpoint-of-another-config": "other",
    "checkpoint-torch-refuses": "payload",
}


class Payload:
    """Unpickled by a loader that runs what a file names, it creates `marker`."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def plant(kind: str, run_dir: Path, sha: str) -> None:
    folder = run_dir / "checkpoint"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"config_sha": sha}))
    state = folder / "state.pt"
    if kind == "random":
        state.write_bytes(random.Random(0).randbytes(4096))
    elif kind == "truncated":
        whole = io.BytesIO()
        torch.save({"config_sha": sha, "t": 0.0, "state": torch.zeros(64)}, whole)
        state.write_bytes(whole.getvalue()[:200])
    elif kind == "other":
        torch.save({"config_sha": "0123456789abcdef", "t": 0.0}, state)
    else:
        torch.save({"config_sha": sha, "state": Payload(run_dir.parent / "MARKER")}, state)


def files(folder: Path) -> dict[str, bytes]:
    """The files under `folder` (Hydra's own, which the CLI writes, apart)."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and not {".hydra", "cli.log"} & set(p.parts)
    }


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict]:
    """Every case run as the command: its exit code, stdout, stderr and directory (its
    output files outside it)."""
    # the suite's data cache (tests/conftest.py): the MNIST-1D that the model x data check
    # reads is made once for the suite, not once here
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    # the driver imports what a refused command imports (not torch._dynamo, which only a
    # run needs) while the cases are made here
    with Driver(env, imports=("hydra", "torch", "stalebench.experiment")) as driver:
        cases, planted = [], {}
        for case_id, (args, _, _) in zip(IDS, CASES, strict=True):
            where = tmp_path_factory.mktemp(case_id)
            out = tmp_path_factory.mktemp(case_id + "-out")
            args = [a.replace("{tmp}", str(where)) for a in args]
            sha = ""
            if case_id in PLANTED:
                sha = config_sha(compose([a for a in args if not a.startswith("hydra.")]))
                plant(PLANTED[case_id], where / "run", sha)
            planted[case_id] = files(where)
            command = case(case_id, where, args, stdout=out / "stdout", stderr=out / "stderr")
            cases.append({**command, "sha": sha})
        # two at a time, the longest first: the one that may have to make MNIST-1D
        cases.sort(key=lambda c: c["id"] != "model-that-cannot-read-the-inputs")
        ran = driver.run(cases, at_once=2)
    return {i: {**c, "planted": planted[i]} for i, c in ran.items()}


@pytest.mark.parametrize(
    "case_id, args, key, value", [(i, *c) for i, c in zip(IDS, CASES, strict=True)], ids=IDS
)
def test_bad_input_is_one_line_and_exit_2(outcomes, case_id, args, key, value):
    case = outcomes[case_id]
    tmp_path = Path(case["cwd"])
    value = value.replace("{tmp}", str(tmp_path)).replace("{sha}", case["sha"])
    stdout, stderr = case["stdout"], case["stderr"]

    assert case["code"] == 2, stderr
    assert stdout == ""
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), stderr
    line = lines[0]
    assert line.startswith("stalebench: error:")
    assert key in line
    assert value in line
    assert not [p for p in tmp_path.rglob("logs") if p.is_dir()], "a process was started"
    assert not list(tmp_path.rglob("events.jsonl"))
    assert not list(tmp_path.rglob("summary.json"))


@pytest.mark.parametrize("case_id", sorted(PLANTED))
def test_a_bad_checkpoint_changes_nothing_and_never_relays_torchs_advice(outcomes, case_id):
    case = outcomes[case_id]
    where = Path(case["cwd"])
    line = case["stderr"]
    assert "weights_only" not in line and "torch.load" not in line, line
    assert files(where) == case["planted"]  # the checkpoint as it was, nothing added
    assert not (where / "MARKER").exists()
