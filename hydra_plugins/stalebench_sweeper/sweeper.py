"""Hydra's basic sweeper, and with a `sweep.tune` block, the tuning protocol around it.

Without `sweep.tune.params` this is BasicSweeper, untouched. With them, one multirun is:

1. the tuning stage: every cell of the grid (the sweep's jobs less their seed) × every
   point of its tuning grid × every tuning seed, evaluated on a validation split carved
   from the training data (eval.split=val), in `<sweep_dir>/tune/<cell>/<point>/<seed>`;
2. selection (stalebench.tuning, from the run directories alone): `<sweep_dir>/tuning.json`;
   a cell whose best point is at an edge of its grid runs one point beyond it at a time
   (`tune/<cell>/<point>/<seed>` after the grid's points) until `tuning.extension` stops;
3. the final stage: the sweep's own jobs, in their usual directories and order, each with
   its cell's selected values as overrides and recorded as `sweep.tune.selected`;
4. the second stage (`sweep.sequential`): while a claim is inconclusive and looks remain,
   the arms of every such claim run the next block of seeds (above the sweep's own, with
   their cells' selections) as look k, in `<sweep_dir>/look<k>/<cell>/<seed>`, recorded
   as `sweep.look`; the claims are judged again (stalebench.report.claim_judge, from disk).

Every job goes through Hydra's launcher (joblib, submitit...). Rerun with the same
`hydra.sweep.dir`, a job whose directory holds a completed or diverged run of the same
overrides is not launched again, and the selection is made again from what is on disk.
"""

# No `from __future__ import annotations`: Hydra's plugin scan runs this module outside
# sys.modules, where a dataclass with string annotations cannot be built.
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import OmegaConf, open_dict

from stalebench import tuning
from stalebench.errors import ConfigError
from stalebench.sweep import SequentialConfig, TuneConfig


@dataclass
class TuningSweeperConf:
    _target_: str = "hydra_plugins.stalebench_sweeper.sweeper.TuningSweeper"
    max_batch_size: Optional[int] = None  # noqa: UP045  (OmegaConf reads the annotation)
    params: Optional[dict[str, str]] = None  # noqa: UP045


ConfigStore.instance().store(
    group="hydra/sweeper", name="stalebench", node=TuningSweeperConf, provider="stalebench"
)

log = logging.getLogger(__name__)

ARMS = "sweep/arms/"  # the config groups a sweep's arms are options of
# overrides that change how a rerun treats a job's directory, not what the job computes
RERUN_KEYS = ("resume", "overwrite")


def _key(override: str) -> str:
    """The key of a `key=value` override, without its +, ++ or ~ prefix."""
    return override.partition("=")[0].lstrip("+~")


def _value(value: Any) -> str:
    """A Python value as an override's value (quoted and escaped as Hydra reads it)."""
    return Override._get_value_element_as_str(value)


class TuningSweeper(BasicSweeper):
    """BasicSweeper, with the tuning protocol of `sweep.tune` when it has params."""

    def sweep(self, arguments: list[str]) -> Any:
        try:
            tune = self._tune()
            plan = self._plan(tune, arguments) if tune.on else None
        except ConfigError as exc:
            _refuse(exc)
        if plan is None:
            return super().sweep(arguments)
        try:
            return self._tuned(tune, *plan)
        except ConfigError as exc:
            _refuse(exc)

    def _tune(self) -> TuneConfig:
        node = OmegaConf.select(self.config, "sweep.tune")
        return TuneConfig() if node is None else OmegaConf.to_object(node)

    def _plan(self, tune: TuneConfig, arguments: list[str]):
        """The sweep's jobs (as BasicSweeper makes them), each one's cell (its overrides
        less the seed), and every cell's grid; None when no cell has anything left to tune
        (a key the sweep's overrides set is theirs: it is taken out of every grid)."""
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        parsed = parser.parse_overrides([*self._parse_config(), *arguments])
        jobs = self.split_arguments(parsed, None)[0]
        keys = [tuple(o for o in job if _key(o) != "seed") for job in jobs]
        cells = list(dict.fromkeys(keys))  # in the grid's order
        pinned = {o.get_key_element().lstrip("+~") for o in parsed}
        for key in sorted(
            pinned & {_key(k) for g in (tune.params, *tune.arms.values()) for k in g}
        ):
            log.warning("sweep.tune: %s is set by the sweep's overrides, so it is not tuned", key)
        layout = [self._cell(tune, cell, pinned) for cell in cells]
        if not any(c["params"] for c in layout):
            return None
        tuning.check_resolution(layout)  # one resolution for every arm, before any job
        self._check(tune, jobs, cells)
        seeds, looks = self._looks(jobs)
        later = {s for k in range(2, len(looks) + 1) for s in _block(seeds, looks, k)}
        if later & set(tune.seeds):
            raise ConfigError(
                f"sweep.tune.seeds {list(tune.seeds)} must not hold a seed of the second "
                f"stage's looks ({min(later)} to {max(later)}, sweep.sequential)"
            )
        return jobs, keys, cells, layout

    def _tuned(self, tune: TuneConfig, jobs, keys, cells, layout) -> Any:
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")

        tuning_jobs = [
            self._tuning_job(tune, cell, i, j, point, seed)
            for i, cell in enumerate(cells)
            if layout[i]["params"]
            for j, point in enumerate(tuning.grid(layout[i]["params"]))
            for seed in tune.seeds
        ]
        dirs = [sweep_dir / job[-1].partition("=")[2] for job in tuning_jobs]
        tuned = sum(1 for c in layout if c["params"])
        log.info(
            "Tuning %d cells x %d runs (%d seeds each) on the validation split",
            tuned, len(tuning_jobs) // tuned, len(tune.seeds),
        )  # fmt: skip
        returns = self._launch(tuning_jobs, dirs, "tuning")

        # the extension: every cell still at an edge runs its next point (all cells of a
        # round at once), then the selection is made again, until no cell has one; a rerun
        # replays the same rounds from disk, launching only what is not finished
        added: list[list[dict[str, Any]]] = [[] for _ in layout]
        content = tuning.record(tune, layout, sweep_dir, added)
        for round_ in range(1, tune.max_extensions + 1):
            nexts = [
                (i, c["extension"]["next"])
                for i, c in enumerate(content["cells"])
                if "next" in c.get("extension", {})
            ]
            if not nexts:
                break
            beyond = [
                self._tuning_job(tune, cells[i], i, content["cells"][i]["points"], nxt["values"], s)
                for i, nxt in nexts
                for s in tune.seeds
            ]
            for i, nxt in nexts:
                log.info("\tcell %d at an edge: %s %s", i, nxt["side"], nxt["values"])
            dirs = [sweep_dir / job[-1].partition("=")[2] for job in beyond]
            returns += self._launch(beyond, dirs, f"tuning extension {round_}")
            for i, nxt in nexts:
                added[i].append(nxt)
            content = tuning.record(tune, layout, sweep_dir, added)
        log.info("Selection -> %s", tuning.write(sweep_dir, content))
        for cell in content["cells"]:
            standing = [c["standing"] for c in cell["candidates"] if c["rank"] == 1]
            log.info(
                "\tcell %d (%s): %s %s",
                cell["cell"], " ".join(cell["overrides"]), cell["selected"], standing,
            )  # fmt: skip

        chosen = {key: c["selected"] for key, c in zip(cells, content["cells"], strict=True)}
        final_jobs = [[*job, *_selected(chosen[key])] for job, key in zip(jobs, keys, strict=True)]
        dirs = [self._job_dir(job, num) for num, job in enumerate(final_jobs)]
        returns += self._launch(final_jobs, dirs, "final")
        return returns + self._later_looks(jobs, keys, cells, chosen, dirs)

    def _later_looks(self, jobs, keys, cells, chosen, dirs: list[Path]) -> list:
        """The second stage: look after look, the cells of the claims still open run the
        look's block of seeds, until no claim is open or the last look has run."""
        from stalebench.report import claim_judge  # the report's own rule
        from stalebench.report.collect import collect

        sweep_dir = Path(self.config.hydra.sweep.dir)
        name = OmegaConf.select(self.config, "sweep.name") or ""
        seeds, looks = self._looks(jobs)
        if not name or len(looks) < 2:
            return []
        cell_of = {d.resolve(): key for d, key in zip(dirs, keys, strict=True)}
        returns: list = []
        done = 1
        while True:
            runs, curves, _ = collect([sweep_dir])
            want = claim_judge.wanting(runs, curves).get(name)
            if not want:
                return returns
            k, run_dirs = want
            if k <= done:  # look k's runs left no run directory to judge: stop, said
                log.warning("look %d: its runs wrote nothing to judge; the second stage stops", k)
                return returns
            done = k
            open_cells = list(dict.fromkeys(
                cell_of[Path(d).resolve()] for d in run_dirs if Path(d).resolve() in cell_of
            ))  # fmt: skip
            block = _block(seeds, looks, k)
            log.info(
                "Look %d of %d: %d cells x seeds %s for the claims still inconclusive",
                k, len(looks), len(open_cells), block,
            )  # fmt: skip
            pairs = [(key, s) for key in open_cells for s in block]
            more = [
                [*key, f"seed={s}", *_selected(chosen[key]), f"++sweep.look={k}",
                 f"hydra.sweep.subdir=look{k}/{cells.index(key)}/{s}"]
                for key, s in pairs
            ]  # fmt: skip
            more_dirs = [sweep_dir / job[-1].partition("=")[2] for job in more]
            cell_of.update((d.resolve(), key) for d, (key, _) in zip(more_dirs, pairs, strict=True))
            returns += self._launch(more, more_dirs, f"look {k}")

    def _looks(self, jobs) -> tuple[list[int], list[tuple[int, float]]]:
        """The sweep's own seeds and its looks (sweep.sequential)."""
        node = OmegaConf.select(self.config, "sweep.sequential")
        sequential = SequentialConfig() if node is None else OmegaConf.to_object(node)
        seeds = sorted(
            {int(o.partition("=")[2]) for job in jobs for o in job if _key(o) == "seed"}
        ) or [int(OmegaConf.select(self.config, "seed") or 0)]
        return seeds, sequential.looks(len(seeds))

    @staticmethod
    def _tuning_job(tune: TuneConfig, cell, i: int, j: int, point, seed: int) -> list[str]:
        """Cell i's tuning run of point j (its values `point`) and one tuning seed, on the
        validation split, in its fixed directory (the last override)."""
        return [
            *cell,
            f"seed={seed}",
            *(f"{k}={_value(v)}" for k, v in point.items()),
            "eval.split=val",
            f"eval.validation_fraction={tune.validation_fraction}",
            f"hydra.sweep.subdir={tuning.run_dir(i, j, seed)}",
        ]

    def _cell(self, tune: TuneConfig, cell: Sequence[str], pinned: set[str]) -> dict[str, Any]:
        """A cell as tuning.json records it: its overrides, its arm, and its grid (the
        arm's own, or the sweep's), less the keys the sweep's overrides set."""
        arms = [o.partition("=")[2] for o in cell if _key(o).startswith(ARMS)]
        own = [a for a in arms if a in tune.arms]
        if len(own) > 1:
            raise ConfigError(
                f"sweep.tune.arms: the cell {' '.join(cell)} has a grid of its own for each "
                f"of {own}; give it one"
            )
        arm = own[0] if own else (arms[0] if arms else None)
        grid = tune.arms[own[0]] if own else tune.params
        params = {k: v for k, v in grid.items() if _key(k) not in pinned}
        return {"overrides": list(cell), "arm": arm, "params": params}

    def _check(self, tune: TuneConfig, jobs, cells) -> None:
        """What the tune block cannot know alone: its seeds against the sweep's, and its
        arms against the sweep's arm groups."""
        finals = {o.partition("=")[2] for job in jobs for o in job if _key(o) == "seed"}
        if not finals:
            finals = {str(OmegaConf.select(self.config, "seed"))}
        shared = sorted(s for s in tune.seeds if str(s) in finals)
        if shared:
            raise ConfigError(
                f"sweep.tune.seeds must not hold a final seed of the sweep "
                f"({', '.join(sorted(finals))}), got {list(tune.seeds)}: {shared} would be "
                "tuned and measured on the same seed"
            )
        groups = {_key(o) for cell in cells for o in cell if _key(o).startswith(ARMS)}
        loader, hydra = self.hydra_context.config_loader, self.config.hydra
        search = dict(
            config_name=hydra.job.config_name,
            overrides=OmegaConf.to_container(hydra.overrides.hydra),
        )
        options = {name for group in groups for name in loader.get_group_options(group, **search)}
        for arm in tune.arms:
            if arm not in options:
                raise ConfigError(
                    f"sweep.tune.arms.{arm}: not an arm of this sweep (its arms: "
                    f"{', '.join(sorted(options)) or 'none: it sweeps no sweep/arms group'})"
                )

    def _job_dir(self, overrides: list[str], num: int) -> Path:
        """The directory Hydra gives the sweep's job number `num` (hydra.sweep.subdir
        resolved as the launcher resolves it)."""
        sweep = self.config.hydra.sweep
        subdir = OmegaConf.to_container(sweep, resolve=False)["subdir"]
        if subdir == "${hydra.job.num}":
            return Path(sweep.dir) / str(num)
        config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(config):
            config.hydra.job.id = num
            config.hydra.job.num = num
        return Path(sweep.dir) / str(config.hydra.sweep.subdir)

    def _launch(self, jobs: list[list[str]], dirs: list[Path], stage: str) -> list:
        """Launch the jobs whose directory holds no finished run of the same overrides (a
        job's directory that holds anything else gets resume=true: the CLI continues it or
        starts it again), in batches of consecutive job numbers."""
        todo = []
        for num, (job, run_dir) in enumerate(zip(jobs, dirs, strict=True)):
            if _finished(run_dir, job):
                continue
            rerun = run_dir.is_dir() and not any(_key(o) == "resume" for o in job)
            todo.append((num, [*job, "resume=true"] if rerun else job))
        if len(todo) < len(jobs):
            done = len(jobs) - len(todo)
            log.info("%s stage: %d of %d jobs finished before", stage, done, len(jobs))
        size = self.max_batch_size if self.max_batch_size and self.max_batch_size > 0 else None
        batches: list[list[tuple[int, list[str]]]] = []
        for num, job in todo:
            last = batches[-1] if batches else None
            if last and last[-1][0] == num - 1 and (size is None or len(last) < size):
                last.append((num, job))
            else:
                batches.append([(num, job)])
        returns = []
        for batch in batches:
            overrides = [job for _, job in batch]
            for _, job in batch:
                try:
                    self.validate_batch_is_legal([job])
                except Exception as exc:
                    raise ConfigError(
                        f"sweep.tune: the {stage} job {' '.join(job)} does not compose: {exc}"
                    ) from None
            results = self.launcher.launch(overrides, initial_job_idx=batch[0][0])
            for r in results:
                _ = r.return_value  # a job that raised stops the sweep, as in BasicSweeper
            returns.append(results)
        return returns


def _block(seeds: list[int], looks: list[tuple[int, float]], k: int) -> list[int]:
    """Look k's new seeds: the next integers above the sweep's own largest seed."""
    start = max(seeds) + 1 + looks[k - 2][0] - looks[0][0]
    return list(range(start, start + looks[k - 1][0] - looks[k - 2][0]))


def _selected(values: dict[str, Any]) -> list[str]:
    """A final job's overrides for its cell's selection: the values, and their record
    (nothing for a cell that was not tuned)."""
    if not values:
        return []
    record = {k.lstrip("+~"): v for k, v in values.items()}
    return [
        *(f"{k}={_value(v)}" for k, v in values.items()),
        f"++sweep.tune.selected={_value(record)}",
    ]


def _finished(run_dir: Path, job: list[str]) -> bool:
    """run_dir holds a completed or diverged run of these very overrides."""
    try:
        status = json.loads((run_dir / "summary.json").read_text())["status"]
        recorded = OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "overrides.yaml"))
    except (OSError, ValueError, KeyError, TypeError):
        return False

    def same(overrides) -> list[str]:
        return [o for o in overrides if not o.startswith("hydra.") and _key(o) not in RERUN_KEYS]

    return status in tuning.TERMINAL and same(recorded) == same(job)


def _refuse(exc: ConfigError):
    """Bad input, before any job starts: one line, as the CLI reports it."""
    print(f"stalebench: error: {exc}", file=sys.stderr)
    sys.exit(2)
