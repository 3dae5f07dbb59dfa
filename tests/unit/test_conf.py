"""The YAML under conf/ only composes: no file restates the default of the schema field it
sets (the dataclass is the only place a default lives), and the pipeline presets' shared
setup composes to the configs the presets had when each spelled it out."""

from __future__ import annotations

import dataclasses
from importlib.resources import files
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from stalebench.config import register_configs
from stalebench.plugins import load as load_plugins
from tests.conftest import compose as run_config

CONF = Path(str(files("stalebench.conf")))
# every YAML of the config tree; sweeps/ (conf/sweep) restate values on purpose
YAMLS = sorted(
    p.relative_to(CONF).as_posix()
    for p in CONF.rglob("*.yaml")
    if p.relative_to(CONF).parts[0] != "sweep"
)
PIPELINE_PRESETS = ("nesterov_pp", "pipedream", "gpipe")


def composed(overrides: list[str]) -> DictConfig:
    load_plugins()
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module("stalebench.conf", version_base=None):
            return compose("config", overrides=overrides)
    finally:
        GlobalHydra.instance().clear()


def package(relpath: str, text: str) -> str:
    """The dotted key the file's values land under (its `# @package` header, else its group)."""
    for line in text.splitlines():
        if line.startswith("# @package"):
            pkg = line.split()[-1]
            return "" if pkg == "_global_" else pkg
    parts = relpath.split("/")
    return ".".join(parts[:-1])


def including(relpath: str) -> list[str]:
    """Overrides that compose a file: its group's selection, or for a file that is not a
    preset (e.g. presets/), a preset whose defaults list includes it."""
    group, _, name = relpath.removesuffix(".yaml").rpartition("/")
    if group in ("algorithm", "cluster"):
        return [f"{group}={name}"]
    if not group:
        return []
    for preset in sorted((CONF / "algorithm").glob("*.yaml")):
        defaults = yaml.safe_load(preset.read_text()).get("defaults") or []
        if f"/{group}/{name}" in defaults:
            return [f"algorithm={preset.stem}"]
    raise AssertionError(f"{relpath}: no preset includes it")


def leaves(node: dict, prefix: str):
    for key, value in node.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            yield from leaves(value, path)
        else:
            yield path, value


def schema_default(cfg: DictConfig, path: str):
    """The default of the dataclass field `path` sets in the composed config, or a sentinel
    when the parent is not a dataclass."""
    parent, _, key = path.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    schema = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
    if schema is None or not dataclasses.is_dataclass(schema):
        return NO_SCHEMA
    field = {f.name: f for f in dataclasses.fields(schema)}.get(key)
    assert field is not None, f"{path}: {schema.__name__} has no field {key!r}"
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return NO_SCHEMA


NO_SCHEMA = object()


def restated(raw: dict, pkg: str, cfg: DictConfig) -> list[str]:
    """`key: value` lines of one file whose value is the schema's default."""
    body = {k: v for k, v in raw.items() if k not in ("defaults", "hydra")}
    found = []
    for path, value in leaves(body, pkg):
        if isinstance(value, str) and "${" in value:
            continue  # an interpolation is not a restated constant
        default = schema_default(cfg, path)
        if default is NO_SCHEMA:
            continue
        same_kind = isinstance(value, bool) == isinstance(default, bool)
        if same_kind and value == default:
            found.append(f"{path}: {value!r}")
    return found


@pytest.mark.parametrize("relpath", YAMLS)
def test_no_yaml_restates_a_dataclass_default(relpath):
    text = (CONF / relpath).read_text()
    raw = yaml.safe_load(text) or {}
    found = restated(raw, package(relpath, text), composed(including(relpath)))
    assert not found, f"conf/{relpath} restates schema defaults: {found}"


def test_the_check_finds_a_restated_default():
    cfg = composed(["algorithm=gpipe"])
    raw = {"algorithm": {"pipeline": {"microbatches": 4, "schedule": "gpipe"}}}
    assert restated(raw, "", cfg) == ["algorithm.pipeline.microbatches: 4"]
    assert restated({"gamma_shape": 100}, "cluster", cfg) == ["cluster.gamma_shape: 100"]
    assert restated({"weight_stashing": True}, "algorithm.pipeline", cfg) != []
    assert restated({"adaptive_momentum": 0}, "algorithm.pipeline", cfg) == []  # 0 is not False


# The pipeline presets' values as they were when each preset spelled out its model, dataset,
# cluster, budget and eval (before the common file in conf/presets/ and before the restated
# defaults went).
PIPELINE_EXPECTED = {
    "engine.name": "pipeline",
    "model.name": "transformer",
    "model.layers": 4,
    "model.width": 64,
    "dataset.name": "chars",
    "dataset.batch_size": 32,
    "cluster.preset": "homogeneous",
    "cluster.compute_ms": 20.0,
    "cluster.num_workers": 4,
    "budget.max_updates": 600,
    "budget.max_wall_s": 0,
    "eval.every_updates": 50,
    "eval.every_s": 1.0,
    "algorithm.optimizer.warmup_steps": 100,
    "algorithm.pipeline.stages": 4,
    "algorithm.pipeline.weight_stashing": True,
    "algorithm.pipeline.microbatches": 4,
    "algorithm.pipeline.clip_norm": 10.0,
}
PIPELINE_OWN = {
    "nesterov_pp": {
        "algorithm.name": "nesterov_pp",
        "algorithm.pipeline.schedule": "async_1f1b",
        "algorithm.optimizer.name": "nadamw",
        "algorithm.optimizer.beta1": 0.99,
    },
    "pipedream": {
        "algorithm.name": "pipedream",
        "algorithm.pipeline.schedule": "async_1f1b",
        "algorithm.optimizer.name": "adamw",
        "algorithm.optimizer.beta1": 0.9,
    },
    "gpipe": {
        "algorithm.name": "gpipe",
        "algorithm.pipeline.schedule": "gpipe",
        "algorithm.optimizer.name": "adamw",
        "algorithm.optimizer.beta1": 0.9,
    },
}


@pytest.mark.parametrize("preset", PIPELINE_PRESETS)
def test_pipeline_presets_compose_as_before(preset):
    cfg = composed([f"algorithm={preset}"])
    expected = {**PIPELINE_EXPECTED, **PIPELINE_OWN[preset]}
    got = {key: OmegaConf.select(cfg, key) for key in expected}
    assert got == expected
    assert OmegaConf.select(cfg, "algorithm.barrier") is None
    assert OmegaConf.select(cfg, "algorithm.update") is None


def test_pipeline_presets_share_one_setup_file():
    for preset in PIPELINE_PRESETS:
        defaults = yaml.safe_load((CONF / "algorithm" / f"{preset}.yaml").read_text())["defaults"]
        assert "/presets/pipeline" in defaults, preset
        assert not any(str(d).startswith("override /") for d in defaults), preset


@pytest.mark.parametrize(
    ("overrides", "label"),
    [
        (["algorithm=ssp"], "ssp"),
        (["algorithm=ssp", "algorithm.barrier.staleness=4"], "ssp"),  # a field: still the preset
        (["algorithm=ssp", "algorithm/barrier=asp"], "asp+sgd"),  # swapped: its parts
        (["algorithm=ssp", "algorithm/update=gap_aware"], "ssp+gap_aware"),
        (["algorithm=ssp", "algorithm/barrier=asp", "algorithm.name=mine"], "mine"),
    ],
)
def test_the_cli_labels_a_run_by_its_parts_once_a_barrier_or_rule_is_swapped(overrides, label):
    assert run_config(overrides).label == label


@pytest.mark.parametrize(
    "overrides,label",
    [
        (["algorithm=sgp", "algorithm/gossip=dpsgd"], "dpsgd+momentum"),
        (["algorithm=nesterov_pp", "algorithm/optimizer=adamw"], "async_1f1b+adamw"),
        (["algorithm=diloco", "algorithm/inner=sgd"], "nesterov+sgd"),
        (["algorithm=ssp", "algorithm/update=dana"], "ssp+dana"),
        (["algorithm=sgp", "algorithm/gossip=dpsgd", "algorithm.name=mine"], "mine"),
        (["algorithm=sgp", "algorithm.gossip.overlap=1"], "sgp"),  # a setting, not a part
    ],
)
def test_a_run_whose_algorithm_part_was_swapped_is_labelled_by_its_parts(overrides, label):
    """Every slot an engine composes, not only barrier and update: `algorithm=sgp
    algorithm/gossip=dpsgd` runs D-PSGD, and must not be reported as SGP."""
    from tests.conftest import compose

    assert compose(overrides).label == label
