"""Engines validate only what they own: a part of the algorithm checks its own fields against
the run (`registry.Part.check`) and says what it needs of an engine (`Part.needs`); the
engine refuses a part whose needs it does not give (`Engine.provides`), naming the part,
and never reads another component's fields."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from stalebench.algorithms.barriers import ASP, BSP, BSPConfig
from stalebench.algorithms.base import Barrier, BarrierConfig
from stalebench.algorithms.gossip import MixingConfig, PushSum
from stalebench.algorithms.local import (
    ElasticConfig,
    InnerConfig,
    InnerOptimizer,
    Leader,
    LeaderConfig,
)
from stalebench.engines.base import ENGINES, Engine
from stalebench.errors import ConfigError
from stalebench.registry import NEEDS, Part, part_class
from tests.conftest import compose, fast_with

ROOT = Path(__file__).resolve().parents[2]
PIPE = ["algorithm=gpipe", "dataset=chars", "model=transformer"]
# a preset of each built-in engine
PRESETS = {
    "ps": ["algorithm=ssp"],
    "allreduce": ["algorithm=bsp", "engine=allreduce"],
    "local": ["algorithm=diloco"],
    "gossip": ["algorithm=sgp"],
    "pipeline": PIPE,
}


def engine_for(overrides: list[str], cls: type[Engine] | None = None) -> Engine:
    cfg = compose(fast_with(["budget.max_updates=5", *overrides]))
    return (cls or ENGINES.get(cfg.engine.name)[0])(cfg.engine, cfg)


def test_the_parts_declare_what_they_need_from_their_own_settings():
    assert BSP.needs(BSPConfig(name="bsp")) == {}
    cfg = BSPConfig(name="bsp", backups=2, rebalance_every=3, on_loss="reform")
    assert BSP.needs(cfg) == {
        "reform": "on_loss=reform",
        "arrivals": "backups=2",
        "batch_sizes": "rebalance_every=3",
    }
    assert ASP.needs(BarrierConfig(name="asp")) == {}
    assert InnerOptimizer.needs(InnerConfig(name="sgd", reset=True)) == {"rounds": "reset=true"}
    assert InnerOptimizer.needs(InnerConfig(name="sgd")) == {}
    # every need an engine gives is one a refusal can say
    for name in ENGINES.names():
        assert ENGINES.get(name)[0].provides <= NEEDS.keys(), name


def test_a_part_whose_need_the_engine_lacks_is_refused_naming_the_part(monkeypatch):
    monkeypatch.setitem(NEEDS, "widgets", "a widget per worker")
    monkeypatch.setattr(ASP, "needs", classmethod(lambda cls, cfg: {"widgets": ""}))
    engine = engine_for(["algorithm=asp"])
    with pytest.raises(ConfigError) as err:
        Engine.validate(engine, None)
    assert str(err.value) == (
        "algorithm.barrier=asp needs a widget per worker, which engine=ps does not give: no "
        "engine registered gives it"
    )

    class Widgets(type(engine)):
        provides = frozenset({"widgets"})

    Engine.validate(engine_for(["algorithm=asp"], Widgets), None)  # given: accepted


def test_a_need_from_a_setting_names_the_setting_and_the_engines_that_give_it():
    engine = engine_for(["algorithm=bsp", "engine=allreduce", "algorithm.barrier.backups=1"])
    with pytest.raises(ConfigError) as err:
        Engine.validate(engine, None)
    assert str(err.value) == (
        "algorithm.barrier=bsp with backups=1 needs each gradient on its own as it arrives (a "
        "server), which engine=allreduce does not give: use engine=ps, or leave "
        "algorithm.barrier.backups at its default"
    )


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_part_checks_itself_in_every_engine(monkeypatch, name):
    """The base's validate asks each part the engine reads to check itself, with the
    engine's number of workers and the run."""
    engine = engine_for(PRESETS[name])
    assert engine.name == name
    seen = []
    for slot in engine.slots:
        cls = part_class(slot, getattr(engine.run.algorithm, slot))
        assert issubclass(cls, Part), (slot, cls)

        def check(cls, cfg, num_workers, run, slot=slot):
            seen.append((slot, num_workers, run))

        monkeypatch.setattr(cls, "check", classmethod(check))
    Engine.validate(engine, None)
    assert seen == [(slot, engine.num_workers, engine.run) for slot in engine.slots]


def test_every_built_in_engine_is_covered():
    built_in = [
        n for n in ENGINES.names() if ENGINES.get(n)[0].__module__.startswith("stalebench.")
    ]
    assert sorted(built_in) == sorted(PRESETS)


def test_a_part_checks_its_own_fields_outside_any_engine():
    with pytest.raises(ConfigError, match=re.escape("algorithm.outer.alpha=0.5 with cluster")):
        part_class("outer", ElasticConfig(name="elastic")).check(
            ElasticConfig(name="elastic", alpha=0.5), 4
        )
    with pytest.raises(ConfigError, match=re.escape("algorithm.outer.groups=5 exceeds")):
        Leader.check(LeaderConfig(name="leader", groups=5), 4)
    with pytest.raises(ConfigError, match=re.escape("algorithm.barrier.backups=4 with")):
        BSP.check(BSPConfig(name="bsp", backups=4), 4)
    ssp = BarrierConfig(name="ssp", on_loss="reform")
    part_class("barrier", ssp).check(ssp, 4)  # ssp re-forms over the survivors: accepted
    with pytest.raises(ConfigError, match=re.escape("barrier dssp decides from more than")):
        Barrier.check(BarrierConfig(name="dssp", on_loss="reform"), 4)
    PushSum.check(MixingConfig(name="pushsum", overlap=1), 4)  # no run: no quorum to check


def test_spares_in_rounds_need_min_replicas_whatever_the_engine():
    """One check in the base: an engine that takes spares and rounds over the replicas left
    needs cluster.min_replicas with cluster.spares."""

    class Rounds(Engine):
        takes_spares = takes_quorum = True

    engine = engine_for(["algorithm=asp", "cluster.spares=1"], Rounds)
    with pytest.raises(ConfigError) as err:
        Engine.validate(engine, None)
    assert str(err.value) == (
        "cluster.spares=1: engine=ps hands a lost worker's place to a spare in rounds that go on "
        "over the replicas left: set cluster.min_replicas too"
    )
    Engine.validate(engine_for(["algorithm=asp", "cluster.spares=1"]), None)  # ps: no rounds


def test_no_engine_reads_a_parts_field_by_name():
    """`getattr(run.algorithm.barrier, "backups", 0)` in an engine reaches into a part's
    config: the part says what it needs instead."""
    engines = ROOT / "stalebench" / "engines"
    found = []
    for path in [engines / "base.py", engines / "parallel.py", *engines.glob("*/__init__.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", "") == "getattr"
                and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant)
                and re.search(
                    r"algorithm|\b(barrier|update|outer|inner|gossip)\b", ast.unparse(node.args[0])
                )
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert not found, found
