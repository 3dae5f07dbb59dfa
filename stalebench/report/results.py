"""``stalebench-results``: a paper sweep's verdicts as a committed artifact.

- ``stalebench-results save SWEEP_DIR...`` copies ``<sweep_dir>/claims.json`` to
  ``results/<sweep>/claims.json`` in the checkout with its provenance (the git commit of
  the code the runs recorded, else the saving checkout's, and whether the tree was dirty,
  the command that ran the sweep, the machine, the
  environment the runs recorded (CPU model and SIMD flags, torch's BLAS, CPU capability and
  threads, Python and package versions), the date, the sweep's wall time, its runs by
  status, and ``<sweep_dir>/tuning.json`` when there is one), then renders.
- ``stalebench-results`` renders every ``results/*/claims.json`` into ``docs/results.md``
  and into README.md's block between ``<!-- results:begin -->`` and ``<!-- results:end -->``
  (one line per sweep).
- ``stalebench-results --check`` (or ``check``) renders in memory and exits 1 naming the
  first line where docs/results.md or the README block differ from it (the CI guard,
  tests/unit/test_results.py). Before that it warns, one line per field and never failing,
  where a committed result's environment differs from this machine's (a result saved
  without one: one line saying so): such a result may not reproduce here to the last digit.

The command line only: the schema is results_schema, a sweep's provenance provenance, the
files results_files, the page results_page, the tuning summary tuning_summary and the check
results_check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# The names stalebench.report.results had before its split by concern, for the tests and
# user scripts that read them here (product code imports the modules themselves).
from stalebench.report.provenance import (  # noqa: F401
    _HOST,
    _LOOK,
    _MACHINE_PATH,
    LOCAL,
    NOT_COMPARED,
    WHERE,
    _count,
    _flat,
    _iso,
    _mtime,
    _summary,
    _task_overrides,
    _yaml,
    code_git,
    environment,
    machine,
    portable,
    portable_command,
    provenance,
    sweep_command,
    wall_time,
)
from stalebench.report.results_check import (  # noqa: F401
    _PROBED,
    COMPARED,
    PROBE,
    _differs,
    _effects,
    _equal,
    _evaluator_inputs,
    _first_difference,
    check,
    check_environment,
    check_runs,
    differences,
    environment_warnings,
    recompute,
    this_machine,
)
from stalebench.report.results_files import (  # noqa: F401
    CENSORED,
    RESULTS,
    RUNS,
    TESTED_KINDS,
    TUNING_STAGE,
    _measures,
    _overrides,
    _scalar,
    _selector_keys,
    _stage,
    load,
    read_runs,
    runs_tables,
    save,
    write_runs,
)
from stalebench.report.results_page import (  # noqa: F401
    _SIDE,
    BEGIN,
    END,
    GENERATED,
    PAGE,
    PERCENT,
    README,
    STATISTIC,
    Unit,
    _advantage,
    _against,
    _anchor,
    _block_span,
    _chance,
    _commit,
    _environment,
    _first,
    _holm,
    _machine,
    _notes,
    _num,
    _runs,
    _seeds,
    _sentence,
    _side,
    _sides,
    _split,
    _t,
    _total,
    duration,
    ours_sentence,
    published_against_ours,
    render,
    render_block,
    render_page,
    rendered,
    section,
    statistics,
    unit,
    verdict_table,
)
from stalebench.report.results_schema import (  # noqa: F401
    _JSON_NAMES,
    _NAME,
    FILE_SCHEMA,
    NULL,
    NUMBER,
    OBJECT,
    PROVENANCE_SCHEMA,
    SELF_CHECK,
    TEXT,
    VERDICT_SCHEMA,
    ClaimsFileError,
    Field,
    _kind,
    read_claims,
    violations,
)
from stalebench.report.tuning_summary import (  # noqa: F401
    STOPPED,
    _cell,
    _edge,
    _extension,
    _setting,
    _tuning_rows,
    tuning_summary,
)


def default_root() -> Path:
    """The checkout this stalebench runs from (an editable install), else the current
    directory."""
    checkout = Path(__file__).resolve().parents[2]
    return checkout if (checkout / "pyproject.toml").is_file() else Path.cwd()


def main(argv: list[str] | None = None) -> int:
    root_opt = argparse.ArgumentParser(add_help=False)
    root_opt.add_argument(
        "--root",
        type=Path,
        default=argparse.SUPPRESS,
        help="the checkout holding results/ (default: stalebench's own)",
    )
    parser = argparse.ArgumentParser(
        prog="stalebench-results",
        parents=[root_opt],
        description="Render results/*/claims.json into docs/results.md and README.md's "
        "summary block (default), check that they match (--check), or save a finished "
        "sweep's verdicts with their provenance (save).",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; warn where a result's environment differs from this machine's; "
        "recompute every verdict from its results/<sweep>/runs.csv; exit 1 naming each claim "
        "whose recomputed verdict, effect or p differs, and the first difference between the "
        "committed docs and what the results render to",
    )
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("check", parents=[root_opt], help="the same as --check")
    save_cmd = commands.add_parser(
        "save",
        parents=[root_opt],
        help="copy <sweep_dir>/claims.json to results/<sweep>/ with its provenance, then render",
    )
    save_cmd.add_argument("sweep_dirs", nargs="+", type=Path, metavar="SWEEP_DIR")
    save_cmd.add_argument(
        "--command",
        dest="sweep_command",
        help="the command line that ran the sweep, when "
        "Hydra's files do not say (default: read from multirun.yaml or the runs' .hydra/)",
    )
    args = parser.parse_args(argv)
    root = getattr(args, "root", None) or default_root()
    try:
        if args.command == "save":
            for sweep_dir in args.sweep_dirs:
                for path in save(sweep_dir, root, args.sweep_command):
                    print(path)
        if args.check or args.command == "check":
            for line in check_environment(root):  # warnings: the numbers may still agree
                print(f"stalebench-results: warning: {line}", file=sys.stderr)
            differ, untabled = check_runs(root)
            for name in untabled:  # saved before runs.csv: not an error
                print(f"stalebench-results: warning: {RESULTS}/{name}/claims.json: no per-run "
                      f"table beside it ({RUNS}): its verdicts are not recomputed",
                      file=sys.stderr)  # fmt: skip
            for line in differ:
                print(f"stalebench-results: {line}", file=sys.stderr)
            problem = check(root)
            if problem:
                print(f"stalebench-results: {problem}", file=sys.stderr)
                print("run `stalebench-results` to render them again", file=sys.stderr)
            return 1 if problem or differ else 0
        for path in render(root):
            print(path)
    except (OSError, ValueError, LookupError) as err:
        for line in str(err).splitlines():  # a ClaimsFileError: one line per problem
            print(f"stalebench-results: error: {line}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
