"""The suite's shared composition (tests/conftest.py's `ChoicesComposedOnce`, which every
test's hydra.compose goes through) gives the config Hydra's own compose gives: for cases of
each kind, the first time (the choices composed) and after (found composed); and it composes
anew whatever changed since: a node of the ConfigStore, a file of a search path's folder."""

from __future__ import annotations

import hydra
import pytest
from omegaconf import OmegaConf

from stalebench.job import config_sha
from tests.conftest import ChoicesComposedOnce, compose, fast_with

CASES = [
    ["budget.max_updates=7"],
    ["algorithm=gpipe", "dataset=chars", "model=transformer", "dataset.batch_size=30"],
    ["algorithm=bsp", "algorithm/update=gap_aware"],
    ["algorithm=streaming_diloco", "algorithm.outer.inner_steps=7"],
    ["+sweep=dssp", "+sweep/arms/dssp=dssp", "cluster.num_workers=2", "seed=1"],
    ["cluster.faults=[{worker:1,at_step:5,action:slow_compute,factor:3,duration_steps:2}]"],
    ["dataset.sharding=dirichlet", "dataset.dirichlet_alpha=0.01", "dataset.batch_size=64"],
    ["runtime=sim", "algorithm=ssp", "algorithm.barrier.staleness=4", "seed=3"],
]


@pytest.fixture
def hydras_own(monkeypatch):
    """Hydra's own compose, and a fresh shared one in its place (what the session's does)."""
    shared = hydra.compose
    own = shared.hydra_compose if isinstance(shared, ChoicesComposedOnce) else shared
    monkeypatch.setattr(hydra, "compose", ChoicesComposedOnce(own))
    return own


def composed(overrides: list[str], register: bool = True):
    """The Hydra config that stalebench.cli.compose_run composes for `overrides` (through
    hydra.compose, whichever it is now); `register`: the ConfigStore filled first, as
    compose_run fills it."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from stalebench.config import register_configs
    from stalebench.plugins import load as load_plugins

    if register:
        load_plugins()
        register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module("stalebench.conf", version_base=None):
            return hydra.compose("config", overrides=overrides)
    finally:
        GlobalHydra.instance().clear()


def test_the_suite_composes_through_the_shared_composition():
    assert isinstance(hydra.compose, ChoicesComposedOnce)


@pytest.mark.parametrize("overrides", CASES, ids=[" ".join(c) for c in CASES])
def test_a_shared_composition_is_hydras_own(hydras_own, monkeypatch, overrides):
    from stalebench.cli import to_run_config

    overrides = fast_with(["budget.max_updates=5", *overrides])
    with monkeypatch.context() as patch:
        patch.setattr(hydra, "compose", hydras_own)
        theirs = composed(overrides)
    their_run = to_run_config(theirs, overrides)
    for _ in range(2):  # the choices composed, then found composed
        mine = composed(overrides)
        assert OmegaConf.to_container(mine) == OmegaConf.to_container(theirs)
        assert OmegaConf.to_yaml(mine) == OmegaConf.to_yaml(theirs), overrides
        assert OmegaConf.is_struct(mine) and OmegaConf.is_struct(theirs)
        assert "hydra" not in mine
        run = to_run_config(mine, overrides)
        assert run == their_run and config_sha(run) == config_sha(their_run)
    assert len(hydra.compose.composed) == 1  # composed once
    assert compose(overrides) == their_run  # stalebench.cli.compose_run's, through it


@pytest.mark.usefixtures("hydras_own")
def test_a_config_changed_after_its_composition_is_not_shared():
    overrides = fast_with(["budget.max_updates=5", "runtime=sim"])
    first = composed(overrides)
    first.cluster.num_workers = 99
    first.budget.max_updates = 7
    again = composed(overrides)
    assert (again.cluster.num_workers, again.budget.max_updates) == (4, 5)


def test_a_profile_written_after_a_composition_is_composed_anew(hydras_own, tmp_path, monkeypatch):
    """A cluster profile in the user's folder (as `stalebench calibrate` writes it),
    rewritten between two compositions of the same choices: the second reads it again."""
    monkeypatch.setenv("STALEBENCH_CONF", str(tmp_path / "conf"))
    profile = tmp_path / "conf" / "cluster" / "mine.yaml"
    profile.parent.mkdir(parents=True)
    overrides = ["cluster=mine", "budget.max_updates=5"]
    profile.write_text("defaults:\n  - homogeneous\n  - _self_\ncompute_ms: 11\n")
    assert compose(overrides).cluster.compute_ms == 11
    profile.write_text("defaults:\n  - homogeneous\n  - _self_\ncompute_ms: 12.5\n")
    assert compose(overrides).cluster.compute_ms == 12.5
    monkeypatch.setenv("STALEBENCH_CONF", str(tmp_path / "elsewhere"))
    with pytest.raises(Exception, match="mine"):  # no such profile there
        compose(overrides)


def test_a_node_stored_after_a_composition_is_composed_anew(hydras_own):
    """A logger's node stored again in the ConfigStore (as a plugin's registration would):
    the next composition of the same choices reads the new one, and the one after it, the
    node put back, the old one again."""
    from hydra.core.config_store import ConfigStore

    from stalebench.config import LoggerConfig

    overrides = fast_with(["budget.max_updates=5", "logger=local"])
    assert composed(overrides).logger.project == "stalebench"
    cs = ConfigStore.instance()
    saved = cs.repo["logger"]["local.yaml"]
    try:
        cs.store(group="logger", name="local", node=LoggerConfig(name="local", project="other"))
        # (register_configs would store stalebench's own node again: not called here)
        assert composed(overrides, register=False).logger.project == "other"
    finally:
        cs.repo["logger"]["local.yaml"] = saved
    assert composed(overrides, register=False).logger.project == "stalebench"
