"""Committed results: docs/results.md and README.md's summary block are what
results/*/claims.json render to (the CI guard), and save / render / --check on synthetic
sweep directories: provenance recorded, wall time from the runs' files, a changed verdict
caught by name."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from stalebench.report import claims as C
from stalebench.report import results as R

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC


def test_committed_docs_are_what_the_committed_results_render_to():
    """Fails when a table in docs/results.md or a line of README.md's block differs from
    its results/<sweep>/claims.json (with no sweep saved: the empty set)."""
    assert R.check(ROOT) is None


def verdict(sweep, claim_id, result, origin="paper", **extra):
    """A verdict dict as claims.json holds it, with the keys the statistical rule adds."""
    return {
        "sweep": sweep,
        "paper": "A. Toy. Stale Things. 2026",
        "scale": "small",
        "id": claim_id,
        "text": f"claim {claim_id}",
        "scope": "",
        "metric": "final_accuracy",
        "kind": "ordering",
        "published": "better",
        "source": "abstract",
        "origin": origin,
        "threshold_from": "ours",
        "margin": 0.01,
        "estimate": 0.05,
        "ci_low": 0.02,
        "ci_high": float("inf"),
        "p": 0.01,
        "p_holm": 0.02,
        "test": "paired t",
        "sides": {"a": "0.9 ± 0.01 (n=5)", "b": "0.85 ± 0.01 (n=5)"},
        "verdict": result,
        "ours": "a − b = 0.05 ± 0.01",
        "n": 5,
        "notes": "",
        **extra,
    }


def run_dir(sweep_dir, job, status, start, end, overrides):
    d = sweep_dir / str(job)
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"seed": job}))
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    summary = {"status": status, "host": {"machine": "x86_64", "cpus": 2, "load_avg": [1.5, 1, 1]}}
    (d / "summary.json").write_text(json.dumps(summary))
    os.utime(d / ".hydra" / "config.yaml", (start, start))
    os.utime(d / "summary.json", (end, end))
    return d


def tuning_cell(cell, arm, lrs, chosen):
    """A cell of tuning.json (stalebench.tuning's format 1): its grid, one run per point."""
    return {
        "cell": cell,
        "overrides": [f"+sweep/arms/toy={arm}", "+sweep=toy"],
        "arm": arm,
        "params": {"algorithm.update.lr": lrs},
        "selected": {"algorithm.update.lr": lrs[chosen]},
        "selected_candidate": chosen,
        "candidates": [
            {
                "candidate": i,
                "values": {"algorithm.update.lr": lr},
                "standing": "reached",
                "score": 0.5 - 0.1 * (i == chosen),
                "runs": [{"seed": 1000, "dir": f"tune/{cell}/{i}/1000", "status": "completed"}],
            }
            for i, lr in enumerate(lrs)
        ],
    }


@pytest.fixture()
def sweep_dir(tmp_path):
    """A finished sweep `toy`: a tuning stage (two cells of two points, 08:00:00 → 08:00:40)
    and two final runs (08:00:50 → 08:01:00 and 08:01:00 → 08:03:30), its claims.json,
    tuning.json and Hydra's multirun.yaml."""
    d = tmp_path / "multirun" / "2027-01-15" / "08-00-00"
    for cell in range(2):
        for point in range(2):
            start = T0 + 20 * cell + 10 * point
            run_dir(d / "tune" / str(cell) / str(point), 1000, "completed", start, start + 10, [])
    run_dir(d, 0, "completed", T0 + 50, T0 + 60, ["+sweep=toy", "algorithm=bsp", "seed=0"])
    run_dir(d, 1, "diverged", T0 + 60, T0 + 210, ["+sweep=toy", "algorithm=asp", "seed=0"])
    how = [
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "hydra.sweep.dir=/x",
        "hydra.mode=MULTIRUN",
    ]
    hydra = {"hydra": {"overrides": {"hydra": how, "task": ["+sweep=toy", "seed=0,1,2"]}}}
    (d / "multirun.yaml").write_text(yaml.safe_dump(hydra))
    claims = {
        "rule": "one-sided paired t-test of the advantage against the margin",
        "alpha": 0.05,
        "correction": "holm",
        "claims": [
            verdict("toy", "fast-beats-slow", "holds"),
            verdict("toy", "slow-beats-fast", "does not hold"),
            verdict("toy", "real-matches-sim", "holds", origin="self-check"),
        ],
    }
    (d / "claims.json").write_text(json.dumps(claims))
    tuning = {
        "format": 1,
        "select": {"metric": "final_loss", "target": None, "better": "lower"},
        "seeds": [1000],
        "validation_fraction": 0.1,
        "cells": [tuning_cell(0, "bsp", [0.1, 0.4], 1), tuning_cell(1, "asp", [0.1, 0.4], 0)],
    }
    (d / "tuning.json").write_text(json.dumps(tuning))
    return d


@pytest.fixture()
def checkout(tmp_path):
    """A git checkout with a README holding the results block, one commit."""
    root = tmp_path / "checkout"
    root.mkdir()
    (root / "README.md").write_text(f"# toy\n\nIntro.\n\n{R.BEGIN}\nstale line\n{R.END}\n\nTail.\n")
    if shutil.which("git"):
        git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "add", "README.md"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", "start"], check=True)
    return root


def test_save_records_the_provenance_of_a_sweep(sweep_dir, checkout):
    (path,) = R.save(sweep_dir, checkout)
    assert path == checkout / "results" / "toy" / "claims.json"
    saved = json.loads(path.read_text())
    source = json.loads((sweep_dir / "claims.json").read_text())
    assert saved["claims"] == source["claims"]
    assert (saved["alpha"], saved["correction"]) == (0.05, "holm")
    prov = saved["provenance"]
    # how it ran (the launcher) kept, where it wrote not
    launcher = "hydra/launcher=joblib hydra.launcher.n_jobs=2"
    assert prov["command"] == f"stalebench -m {launcher} +sweep=toy seed=0,1,2"
    assert prov["wall_time"] == {  # the tuning stage's first start to the last final run's end
        "start": "2027-01-15T08:00:00Z",
        "end": "2027-01-15T08:03:30Z",
        "seconds": 200.0,  # a run under way: the 10 s between the stages not counted
        "span": 210.0,
    }
    assert prov["runs"] == {"total": 2, "by_status": {"completed": 1, "diverged": 1}}
    assert prov["tuning_runs"] == {"total": 4, "by_status": {"completed": 4}}
    assert prov["machine"]["arch"] == ["x86_64"] and prov["machine"]["cpus"] == [2]
    assert prov["machine"]["load_avg_1min"]["max"] == 1.5
    assert {"platform", "python", "torch", "stalebench"} <= set(prov["machine"])
    assert prov["saved_at"] and prov["sweep_dir"] == sweep_dir.name
    assert saved["tuning"] == json.loads((sweep_dir / "tuning.json").read_text())
    if shutil.which("git"):
        head = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        assert prov["git"]["commit"] == head
        assert prov["git"]["dirty"] is False  # results/ is written after the state is read


def test_the_dirty_tree_is_recorded(sweep_dir, checkout):
    if not shutil.which("git"):
        pytest.skip("git is not installed")
    (checkout / "README.md").write_text((checkout / "README.md").read_text() + "edit\n")
    (path,) = R.save(sweep_dir, checkout)
    git = json.loads(path.read_text())["provenance"]["git"]
    assert git["dirty"] is True and git["dirty_paths"] == ["README.md"]


def with_code(sweep_dir, commits):
    """Every run's summary records the code that ran it (`host.git`), in turn from `commits`."""
    summaries = sorted(sweep_dir.rglob("summary.json"))
    for i, path in enumerate(summaries):
        summary = json.loads(path.read_text())
        summary["host"]["git"] = {"commit": commits[i % len(commits)], "dirty": False}
        path.write_text(json.dumps(summary))


def test_the_commit_is_the_code_that_ran_the_runs_not_the_saving_tree(sweep_dir, checkout):
    ran = "a" * 40
    with_code(sweep_dir, [ran])
    path, page, _ = saved_and_rendered(sweep_dir, checkout)
    git = json.loads(path.read_text())["provenance"]["git"]
    assert git["commit"] == ran and git["of"] == "runs"
    assert git["saved_from"] != ran  # the checkout's own commit (None outside git)
    assert f"`{ran[:12]}` (clean tree, the runs' code" in page


def test_runs_of_several_commits_name_no_single_commit(sweep_dir, checkout):
    with_code(sweep_dir, ["a" * 40, "b" * 40])
    (path,) = R.save(sweep_dir, checkout)
    git = json.loads(path.read_text())["provenance"]["git"]
    assert git["commit"] is None and git["commits"] == ["a" * 40, "b" * 40]


def test_without_multirun_yaml_the_command_merges_the_runs_overrides(sweep_dir, checkout):
    (sweep_dir / "multirun.yaml").unlink()
    (path,) = R.save(sweep_dir, checkout)
    command = json.loads(path.read_text())["provenance"]["command"]
    assert command == "stalebench -m +sweep=toy algorithm=bsp,asp seed=0"


def test_a_sweep_dir_without_claims_is_refused(tmp_path, checkout):
    with pytest.raises(FileNotFoundError, match="no claims.json"):
        R.save(tmp_path, checkout)


def test_render_writes_the_page_and_only_the_readme_block(sweep_dir, checkout):
    R.save(sweep_dir, checkout)
    R.render(checkout)
    page = (checkout / "docs" / "results.md").read_text()
    assert "## toy" in page and "n_jobs=2 +sweep=toy seed=0,1,2`" in page
    assert "3 min 20 s" in page and "2027-01-15 08:00:00 UTC" in page
    verdicts = json.loads((sweep_dir / "claims.json").read_text())["claims"]
    assert f"Verdicts: {C.tally(verdicts, 'toy')}." in page
    assert "1 holds, 1 does not hold" in page and "self-checks: 1 holds" in page
    # the tuning selection: the cell told apart by its arm, its grid, the point chosen
    grid = "algorithm.update.lr ∈ {0.1, 0.4}"
    assert f"| +sweep/arms/toy=bsp | {grid} | algorithm.update.lr = 0.4 | 0.4 | reached |" in page
    assert f"| +sweep/arms/toy=asp | {grid} | algorithm.update.lr = 0.1 | 0.4 | reached |" in page
    assert "select: metric final_loss, better lower; seeds: 1000; validation_fraction: 0.1" in page
    # each claim a row of its table, its statistics folded below
    assert page.count("| **fast-beats-slow**: ") == page.count("| **real-matches-sim**: ") == 1
    assert page.count("- **fast-beats-slow**: paired t; ") == 1
    readme = (checkout / "README.md").read_text()
    assert readme.startswith("# toy\n\nIntro.\n\n" + R.BEGIN)
    assert readme.endswith(R.END + "\n\nTail.\n") and "stale line" not in readme
    line = next(x for x in readme.splitlines() if "docs/results.md#toy" in x)
    assert f"| 2 (+ 4 tuning) | 3 min 20 s | {C.tally(verdicts, 'toy')} |" in line
    assert R.check(checkout) is None
    assert R.render(checkout) == []  # rendering again changes nothing


def test_check_names_a_changed_verdict(sweep_dir, checkout):
    (path,) = R.save(sweep_dir, checkout)
    R.render(checkout)
    saved = json.loads(path.read_text())
    saved["claims"][0]["verdict"] = "inconclusive"
    path.write_text(json.dumps(saved))
    problem = R.check(checkout)
    assert problem.startswith("docs/results.md, line ")
    committed, rendered = problem.splitlines()[1:]
    assert "1 holds, 1 does not hold" in committed
    assert "1 does not hold, 1 inconclusive" in rendered
    assert R.main(["--root", str(checkout), "--check"]) == 1
    assert R.main(["--root", str(checkout)]) == 0  # render again
    assert R.main(["--root", str(checkout), "--check"]) == 0


def test_check_names_a_hand_edited_readme_block(sweep_dir, checkout):
    R.save(sweep_dir, checkout)
    R.render(checkout)
    readme = checkout / "README.md"
    readme.write_text(readme.read_text().replace("1 does not hold", "0 does not hold"))
    assert R.check(checkout).startswith("README.md, line ")


def test_check_with_no_results_compares_the_empty_set(checkout):
    assert R.check(checkout).startswith("docs/results.md, line 1")  # no page yet
    R.render(checkout)
    assert "No sweep has been saved yet." in (checkout / "docs" / "results.md").read_text()
    assert R.check(checkout) is None
    (checkout / "README.md").write_text("# toy\n")
    assert "has no <!-- results:begin -->" in R.check(checkout)


def test_the_save_command_saves_then_renders(sweep_dir, checkout, capsys):
    assert R.main(["save", str(sweep_dir), "--root", str(checkout)]) == 0
    out = capsys.readouterr().out
    assert str(checkout / "results" / "toy" / "claims.json") in out
    assert R.check(checkout) is None


def test_a_selection_at_the_edge_of_its_grid_is_marked():
    from stalebench.report.results import _edge

    grid = [0.025, 0.1, 0.4, 1.6]
    assert _edge(1.6, grid) == _edge(0.025, grid) == " (edge)"
    assert _edge(0.4, grid) == ""
    assert _edge("adamw", ["adam", "adamw", "nadam"]) == ""  # not a number: no edge
    assert _edge(1.0, [0.5, 1.0]) == ""  # a grid of two has no inside


# a damaged results/<sweep>/claims.json: one line naming the file, the claim and the field;
# nothing rendered, and --check fails


def saved_and_rendered(sweep_dir, checkout):
    """The committed file of `toy` and the docs rendered from it (their text)."""
    (path,) = R.save(sweep_dir, checkout)
    R.render(checkout)
    return path, (checkout / R.PAGE).read_text(), (checkout / R.README).read_text()


def assert_refused(checkout, capsys, page, readme, *expected):
    """Rendering and --check both fail, each with the same one line naming `expected`;
    the docs are left as they were."""
    for args in ([], ["--check"]):
        assert R.main(["--root", str(checkout), *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("stalebench-results: error: "), err
        for part in expected:
            assert part in err, (part, err)
    assert (checkout / R.PAGE).read_text() == page
    assert (checkout / R.README).read_text() == readme


def test_a_claim_without_its_verdict_is_named_with_its_file(sweep_dir, checkout, capsys):
    path, page, readme = saved_and_rendered(sweep_dir, checkout)
    saved = json.loads(path.read_text())
    del saved["claims"][1]["verdict"]
    path.write_text(json.dumps(saved))
    assert_refused(
        checkout,
        capsys,
        page,
        readme,
        'results/toy/claims.json: claims[1] (slow-beats-fast): no "verdict"',
    )


def test_a_file_without_claims_is_refused_not_rendered_as_no_claims(sweep_dir, checkout, capsys):
    path, page, readme = saved_and_rendered(sweep_dir, checkout)
    saved = json.loads(path.read_text())
    del saved["claims"]
    path.write_text(json.dumps(saved))
    assert_refused(checkout, capsys, page, readme, 'results/toy/claims.json: no "claims"')
    assert "no claims" not in page


def test_a_truncated_file_is_named_with_the_position_it_ends_at(sweep_dir, checkout, capsys):
    path, page, readme = saved_and_rendered(sweep_dir, checkout)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    line = text[: len(text) // 2].count("\n") + 1
    assert_refused(
        checkout, capsys, page, readme, "results/toy/claims.json: not JSON", f"line {line}, column"
    )


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda c: c.update(verdict="maybe"), '"verdict" is "maybe", not one of holds, does not'),
        (lambda c: c.update(margin="0.01"), '"margin" is a string, not a number'),
        (lambda c: c.update(margin=True), '"margin" is a boolean, not a number'),
        (lambda c: c.update(p=None, p_holm="x"), '"p_holm" is a string, not a number or null'),
        (lambda c: c.update(sweep="other"), '"sweep" is "other", not "toy" (its directory)'),
        (lambda c: c.update(origin="blog"), '"origin" is "blog", not one of paper, recalled'),
    ],
    ids=["verdict", "margin-text", "margin-bool", "p_holm", "sweep", "origin"],
)
def test_a_claim_field_of_the_wrong_kind_is_named(sweep_dir, checkout, capsys, edit, expected):
    path, page, readme = saved_and_rendered(sweep_dir, checkout)
    saved = json.loads(path.read_text())
    edit(saved["claims"][0])
    path.write_text(json.dumps(saved))
    where = "results/toy/claims.json: claims[0] (fast-beats-slow): "
    assert_refused(checkout, capsys, page, readme, where + expected)


def test_every_violation_of_a_file_is_a_line_of_its_own(sweep_dir, checkout, capsys):
    path, _, _ = saved_and_rendered(sweep_dir, checkout)
    saved = json.loads(path.read_text())
    del saved["claims"][0]["verdict"], saved["claims"][2]["id"]
    saved["provenance"] = "by hand"
    path.write_text(json.dumps(saved))
    assert R.main(["--root", str(checkout), "--check"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        'stalebench-results: error: results/toy/claims.json: "provenance" is a string, '
        "not an object",
        "stalebench-results: error: results/toy/claims.json: claims[0] (fast-beats-slow): "
        'no "verdict"',
        'stalebench-results: error: results/toy/claims.json: claims[2]: no "id"',
    ]


def test_save_refuses_a_sweeps_claims_json_that_misses_a_field(sweep_dir, checkout, capsys):
    source = sweep_dir / "claims.json"
    data = json.loads(source.read_text())
    del data["claims"][0]["verdict"]
    source.write_text(json.dumps(data))
    assert R.main(["save", str(sweep_dir), "--root", str(checkout)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f'stalebench-results: error: {source}: claims[0] (fast-beats-slow): no "verdict"\n'
    )
    assert not (checkout / "results").exists()


def test_a_p_without_its_holm_adjustment_renders(sweep_dir, checkout):
    path, _, _ = saved_and_rendered(sweep_dir, checkout)
    saved = json.loads(path.read_text())
    saved["claims"][0]["p_holm"] = None  # allowed by the schema: the table must format it
    path.write_text(json.dumps(saved))
    assert R.main(["--root", str(checkout)]) == 0
    assert "p = 0.01 (one-sided), Holm p —;" in (checkout / R.PAGE).read_text()


# -- the environment: recorded by the runs, saved with the result, checked against this
# machine (a warning per differing field, never a failure)

# a run's environment as summary.json's `host` holds it beside machine, cpus and load_avg
# (stalebench.job.environment's shape)
ENV = {
    "cpu": {"model": "Toy CPU 9000", "flags": ["avx", "avx2", "fma", "sse2"]},
    "torch": {"blas": "mkl", "lapack": "mkl", "capability": "AVX2", "threads": 1},
    "python": "3.11.7",
    "platform": "Linux-6.0-x86_64",
    "versions": {"torch": "2.13.0+cpu", "numpy": "2.4.6", "scipy": "1.17.1"},
}


def with_environment(sweep_dir, env=ENV, only=None):
    """Give the fixture's runs (or those under `only`) the environment `env` in summary.json."""
    for summary in sorted(sweep_dir.rglob("summary.json")):
        if only is None or only in summary.parents:
            data = json.loads(summary.read_text())
            data["host"] = {**data["host"], **json.loads(json.dumps(env))}
            summary.write_text(json.dumps(data))


def test_a_run_records_its_environment_in_summary_json(job):
    """A real (simulated) run: the CPU and its SIMD flags, torch's BLAS and threads, and
    the versions of the packages that can change its numbers."""
    from stalebench.job import PACKAGES

    host = job("runtime=sim", "budget.max_updates=20").summary["host"]
    assert {"machine", "cpus", "load_avg", "cpu", "torch", "python", "versions"} <= set(host)
    assert host["cpu"]["model"]
    if Path("/proc/cpuinfo").is_file():  # Linux: the flags, SIMD only
        flags = host["cpu"]["flags"]
        assert flags and all(not f.startswith(("smep", "smap", "vmx", "svm")) for f in flags)
    assert host["torch"]["blas"] and host["torch"]["capability"]
    assert host["torch"]["threads"] == 1  # num_threads' default, what the run computed with
    assert set(host["versions"]) == set(PACKAGES)
    for package in ("torch", "numpy", "scipy", "mnist1d", "hydra-core", "stalebench"):
        assert host["versions"][package], package


@pytest.mark.parametrize(
    ("cpuinfo", "model", "flags"),
    [
        (
            "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse sse2 ssse3 smep smap "
            "avx avx2 fma f16c avx512f avx512_bf16 amx_tile vmx\n\nprocessor\t: 1\n"
            "model name\t: other\nflags\t\t: fpu\n",
            "AMD EPYC",
            ["amx_tile", "avx", "avx2", "avx512_bf16", "avx512f", "f16c", "fma", "sse", "sse2",
             "ssse3"],
        ),
        (
            "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes sha2 asimddp "
            "sve sve2 bf16 i8mm sme smep\nCPU implementer\t: 0x41\nCPU part\t: 0xd4f\n",
            "implementer 0x41 part 0xd4f",
            ["asimd", "asimddp", "bf16", "fp", "i8mm", "sme", "sve", "sve2"],
        ),
    ],
    ids=["x86", "arm"],
)  # fmt: skip
def test_the_cpu_is_its_model_and_its_simd_flags(cpuinfo, model, flags):
    from stalebench.job import cpu

    assert cpu(cpuinfo) == {"model": model, "flags": flags}


def test_save_records_the_environment_the_runs_recorded(sweep_dir, checkout):
    with_environment(sweep_dir)
    (path,) = R.save(sweep_dir, checkout)
    assert json.loads(path.read_text())["provenance"]["environment"] == ENV
    R.render(checkout)
    page = (checkout / R.PAGE).read_text()
    assert "| environment | Toy CPU 9000 (avx avx2 fma sse2); torch: BLAS mkl, AVX2 kernels" in page
    assert R.check(checkout) is None


def test_save_names_the_fields_the_runs_disagree_on_and_the_runs_without_one(sweep_dir, checkout):
    with_environment(sweep_dir)
    other = {**ENV, "torch": {**ENV["torch"], "threads": 2}}
    with_environment(sweep_dir, other, only=sweep_dir / "tune" / "1")
    data = json.loads((sweep_dir / "0" / "summary.json").read_text())
    data["host"] = {"machine": "x86_64", "cpus": 2, "load_avg": [1, 1, 1]}  # an older run
    (sweep_dir / "0" / "summary.json").write_text(json.dumps(data))
    (path,) = R.save(sweep_dir, checkout)
    env = json.loads(path.read_text())["provenance"]["environment"]
    assert env["varies"] == {"torch.threads": [1, 2]} and env["unrecorded_runs"] == 1
    assert env["cpu"] == ENV["cpu"]


def test_a_sweep_whose_runs_recorded_no_environment_saves_none(sweep_dir, checkout):
    (path,) = R.save(sweep_dir, checkout)
    assert json.loads(path.read_text())["provenance"]["environment"] is None


def result_with(env):
    return {"name": "toy", "provenance": {"environment": env}}


def test_each_field_that_differs_from_this_machine_is_one_warning():
    here = json.loads(json.dumps(ENV))
    assert R.environment_warnings([result_with(ENV)], here) == []
    here["cpu"] = {"model": "Other CPU", "flags": ["avx", "avx512f", "fma", "sse2"]}
    here["versions"]["numpy"] = "2.5.0"
    here["torch"]["threads"] = 16  # set by the run's config, not the machine: not compared
    here["platform"] = "Linux-6.1-x86_64"  # the kernel's build: not compared
    assert R.environment_warnings([result_with(ENV)], here) == [
        "results/toy/claims.json: cpu.flags: this machine lacks avx2, adds avx512f",
        'results/toy/claims.json: cpu.model: recorded "Toy CPU 9000", this machine "Other CPU"',
        'results/toy/claims.json: versions.numpy: recorded "2.4.6", this machine "2.5.0"',
    ]


def test_a_field_the_runs_disagreed_on_warns_only_outside_their_values():
    env = {**ENV, "varies": {"versions.numpy": ["2.4.6", "2.5.0"]}}
    here = json.loads(json.dumps(ENV))
    here["versions"]["numpy"] = "2.5.0"
    assert R.environment_warnings([result_with(env)], here) == []
    here["versions"]["numpy"] = "2.6.0"
    assert R.environment_warnings([result_with(env)], here) == [
        'results/toy/claims.json: versions.numpy: recorded ["2.4.6", "2.5.0"], this machine "2.6.0"'
    ]


def test_a_result_without_an_environment_is_one_warning_and_an_unread_machine_another():
    unrecorded = [result_with(None), {"name": "old", "provenance": {}}]
    lines = R.environment_warnings(unrecorded, None)
    assert len(lines) == 2 and all("environment unrecorded" in x for x in lines)
    assert lines[1].startswith("results/old/claims.json: ")
    lines = R.environment_warnings([result_with(ENV)], None, "No module named 'torch'")
    assert lines == [
        "this machine's environment could not be read (No module named 'torch'): not compared"
    ]


@pytest.mark.slow  # a subprocess importing torch (the probe)
@pytest.mark.timeout(120)
def test_this_machine_is_probed_as_a_run_records_it():
    from stalebench.job import environment

    here, why = R.this_machine()
    assert why is None and set(here) == set(environment())
    assert here["cpu"] == environment()["cpu"] and here["versions"] == environment()["versions"]


@pytest.mark.slow  # a subprocess importing torch (the probe)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", [["--check"], ["check"]])
def test_check_warns_on_a_differing_environment_and_keeps_its_exit_codes(
    sweep_dir, checkout, capsys, command
):
    with_environment(sweep_dir)  # Toy CPU 9000: not this machine
    (path,) = R.save(sweep_dir, checkout)
    R.render(checkout)
    assert R.main(["--root", str(checkout), *command]) == 0
    warnings = capsys.readouterr().err.splitlines()
    prefix = "stalebench-results: warning: results/toy/claims.json: "
    assert f'{prefix}cpu.model: recorded "Toy CPU 9000", this machine ' in "\n".join(warnings)
    assert all(x.startswith(prefix) for x in warnings) and len(warnings) >= 2
    saved = json.loads(path.read_text())
    saved["claims"][0]["verdict"] = "inconclusive"
    path.write_text(json.dumps(saved))
    assert R.main(["--root", str(checkout), *command]) == 1  # a changed verdict still fails
    err = capsys.readouterr().err
    assert "docs/results.md, line " in err and f"{prefix}cpu.model" in err


def test_check_passes_on_the_committed_results_warning_for_each_unrecorded_one(capsys):
    assert R.main(["--root", str(ROOT), "--check"]) == 0
    unrecorded = [r for r in R.load(ROOT) if not r["provenance"].get("environment")]
    lines = capsys.readouterr().err.splitlines()
    assert sum("environment unrecorded" in x for x in lines) == len(unrecorded)


def test_the_second_stages_runs_are_counted_apart(sweep_dir, checkout):
    # look 2 of a claim left open at the sweep's seeds: two more runs, after the final ones
    run_dir(sweep_dir / "look2" / "0", 3, "completed", T0 + 220, T0 + 230, ["seed=3"])
    run_dir(sweep_dir / "look2" / "1", 3, "completed", T0 + 230, T0 + 240, ["seed=3"])
    (path,) = R.save(sweep_dir, checkout)
    prov = json.loads(path.read_text())["provenance"]
    assert prov["runs"] == {"total": 2, "by_status": {"completed": 1, "diverged": 1}}
    assert prov["look_runs"] == {"total": 2, "by_status": {"completed": 2}}
    assert prov["wall_time"]["seconds"] == 220.0  # 200, then 220 → 240 (idle 210 → 220)
    block = R.render_block(R.load(checkout))
    assert "2 (+ 2 in later looks, + 4 tuning)" in block


def test_a_sweeps_published_numbers_are_a_table_of_their_own():
    """kind=reproduces: the paper's number, ours, ours / paper and the tolerance, a row a
    claim; a claim without a usable seed has a dash, not a zero; no table without one."""
    from stalebench.report.results import section

    def published(claim_id, ours, verdict_):
        return verdict("toy", claim_id, verdict_, kind="reproduces", metric="throughput",
                       scope="model.name=vgg19, best over bw", test="count",
                       reproduced={"paper": 0.66, "ours": ours, "tolerance": 1.5,
                                   "ratio": None if ours is None else ours / 0.66})  # fmt: skip

    result = {"name": "toy", "claims": [published("vgg", 0.33, "does not hold"),
                                        published("none", None, "inconclusive"),
                                        verdict("toy", "plain", "holds")]}  # fmt: skip
    text = "\n".join(section(result))
    assert "Published against ours:" in text
    metric = "throughput (model.name=vgg19, best over bw)"
    assert f"| vgg | {metric} | 0.66 | 0.33 | 0.5 | ×1.5 |" in text
    assert f"| none | {metric} | 0.66 | — | — | ×1.5 |" in text
    plain = {"name": "toy", "claims": [verdict("toy", "plain", "holds")]}
    assert "Published against ours" not in "\n".join(section(plain))
