"""One error style for what a user types: an unknown key or name is refused in one line that
names it and the nearest valid ones, and a value of the wrong type in one line naming the
type, with exit 2 and no run directory, before torch is imported; `--help`, `list --help`
and `list <group>` answer."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)


def stalebench(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stalebench.cli", *args],
        cwd=cwd, capture_output=True, text=True, timeout=100,
    )  # fmt: skip


def refused(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stalebench: error: "), out.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        (
            "budget.max_wall=10",
            "budget.max_wall: no such config key; did you mean budget.max_wall_s",
        ),
        # Hydra's own hint for it, which the run then ignored
        (
            "+budget.max_wall=10",
            "budget.max_wall: no such config key; did you mean budget.max_wall_s",
        ),
        ("cluster.num_worker=3", "did you mean cluster.num_workers"),
        ("lr=0.1", "lr: no such config key; did you mean algorithm.inner.lr"),
        ("budget.foo=1", "budget.foo: no such config key (budget has: diverge_factor, max_updates"),
        ("algorithm=sssp", "algorithm: unknown 'sssp'; did you mean ssp or dssp? known: asp"),
        ("model=resnet", "model: unknown 'resnet'; did you mean"),
    ],
)
def test_an_unknown_key_or_name_is_refused_in_one_line_with_the_nearest(tmp_path, arg, message):
    out = stalebench(arg, "logger=none", "budget.max_updates=1", f"hydra.run.dir={tmp_path}/run",
                     cwd=tmp_path)  # fmt: skip
    line = refused(out)
    assert message in line, line
    assert "+budget" not in out.stdout + out.stderr  # never Hydra's append hint
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "bad", ["budget.max_wall=10", "algorithm.update.lr=-1", "cluster.num_workers=four"]
)
def test_keys_of_the_schema_pass_and_the_refusal_imports_no_torch(tmp_path, bad):
    # every kind of valid key passes the check (a nested part's, a free-form mapping's, a
    # list's), and a refusal, of a key, a value or a value's type, is reached without
    # importing torch (the type: before Hydra composes, whose own error is seven lines)
    code = (
        "import sys\n"
        "from stalebench import cli, plugins\n"
        "from stalebench.config import register_configs\n"
        "plugins.load(); register_configs()\n"
        "cli.check_keys(['algorithm.update.lr=1', 'model.hidden=[3]', 'sweep.params.t=1',\n"
        "                '+sweep=ssp', 'cluster.faults=[]', '~cluster.faults', 'hydra.run.dir=x',\n"
        "                '-m', 'algorithm.barrier.staleness=3', 'eval.every_s=1'], cli.groups())\n"
        f"sys.argv = ['stalebench', {bad!r}]\n"
        "try:\n"
        "    cli.main()\n"
        "except SystemExit as exc:\n"
        "    print(exc.code, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=100)  # fmt: skip
    assert out.stdout.split() == ["2", "False"], out.stdout + out.stderr


def test_help_list_help_and_list_of_a_group(tmp_path):
    help_ = stalebench("--help", cwd=tmp_path)
    assert help_.returncode == 0 and help_.stdout.startswith("usage: stalebench")
    assert "powered by Hydra" not in help_.stdout
    listed = stalebench("list", "--help", cwd=tmp_path)
    assert listed.returncode == 0 and listed.stdout.startswith("usage: stalebench list")
    models = stalebench("list", "model", cwd=tmp_path)
    assert models.returncode == 0 and models.stdout.startswith("models (model=)")
    assert "  cnn " in models.stdout and "engines" not in models.stdout
    line = refused(stalebench("list", "modle", cwd=tmp_path))
    assert "list: no group 'modle'; did you mean model?" in line
