"""Name -> (class, config dataclass) registries, one per kind of component.

The decorator that registers a class also stores its config dataclass in Hydra's
ConfigStore under the registry's group, so `algorithm/barrier=ssp` on the command line
selects exactly the schema the class is built from (the dataclass is the config).
Loading the built-ins and the plugins is `stalebench.plugins.load`, above every registry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from hydra.core.config_store import ConfigStore

from stalebench.errors import ConfigError

T = TypeVar("T")


@dataclasses.dataclass
class ComponentConfig:
    """Base of every registered component's config; `name` selects the class."""

    name: str = ""

    @property
    def label(self) -> str:
        """How a run's label names it (`<barrier>+<update>`, ...)."""
        return self.name


# The algorithm's parts, `algorithm.<slot>` → the base class of its configs, in the order
# declared: every registry of a group `algorithm/<slot>` declares its slot, a part without
# a registry calls `algorithm_part`. The run's schema has an optional field for each
# (`config.register_configs`), and an engine's `slots` name the parts it reads: an engine
# that brings a kind of algorithm of its own declares it in its own package.
PARTS: dict[str, type] = {}
# every registry, by its config group, in the order made: what `stalebench list` shows and
# the CLI checks names against
REGISTRIES: dict[str, Registry] = {}
# the classes a checkpoint may hold besides tensors and plain data (`stored`): every
# registered class and its config, and the helpers they keep. A checkpoint is read by
# torch's weights-only loader, which rebuilds these and nothing else (it calls no other
# code a file names)
STORED: set[type] = set()


def stored(cls: type[T]) -> type[T]:
    """Mark `cls` as data a checkpoint may hold (a helper object a registered part keeps,
    such as a rule's buffers or a worker's faults); a registered class is marked already."""
    STORED.add(cls)
    return cls


def algorithm_part(slot: str, base: type) -> None:
    if PARTS.setdefault(slot, base) is not base:
        raise ValueError(f"algorithm.{slot} is already a part, of {PARTS[slot].__name__}")


# What an algorithm's part may need of the engine it runs in (`Part.needs`), each said as a
# refusal completes "<part> needs ...". An engine lists those it gives in `provides`; a part
# that needs one its engine does not give is refused before any process starts, by name.
# A plugin may add its own.
NEEDS: dict[str, str] = {
    "arrivals": "each gradient on its own as it arrives (a server)",
    "batch_sizes": "each gradient weighed by the size of its minibatch (a server)",
    "reform": "the barrier re-formed over the workers left when one is lost (a server)",
    "rounds": "rounds to reset the local optimizer at",
}


class Part:
    """What an algorithm's part (a barrier, an update rule, an outer rule, a mixing rule...)
    says to the engine that reads it, as class methods with defaults that accept: the
    engine's `validate` asks them of every part in its `slots`. A part's class need not
    derive from it; one that does not is taken as needing nothing and checking nothing."""

    @classmethod
    def needs(cls, cfg: Any) -> dict[str, str]:
        """What this part, set as `cfg`, needs of its engine (keys of `NEEDS`), each with
        the setting that makes it need it, as `key=value` of its own config ("" when the
        part needs it whatever its settings)."""
        return {}

    @classmethod
    def check(cls, cfg: Any, num_workers: int, run: Any = None) -> None:
        """Refuse (ConfigError naming its keys) what this part, set as `cfg`, cannot do with
        `num_workers` workers in `run` (the run's config; None when the part is built
        outside a run): its own fields, against the run it is in."""


def part_class(slot: str, cfg: Any) -> type:
    """The class of part `algorithm.<slot>` set as `cfg`: its registry's entry for
    `cfg.name`, or, for a part with no registry (`algorithm_part`), its config's class."""
    registry = REGISTRIES.get(f"algorithm/{slot}")
    return registry.get(cfg.name)[0] if registry else type(cfg)


class Registry(Generic[T]):
    def __init__(
        self, kind: str, group: str, config_path: str, base: type[ComponentConfig] = ComponentConfig
    ):
        self.kind = kind  # e.g. "barrier"
        self.group = group  # Hydra config group, e.g. "algorithm/barrier"
        self.config_path = config_path  # dotted config key, e.g. "algorithm.barrier"
        self._entries: dict[str, tuple[type[T], type[ComponentConfig]]] = {}
        REGISTRIES[group] = self
        if group.startswith("algorithm/"):
            algorithm_part(group.removeprefix("algorithm/"), base)

    def register(self, name: str, config: type[ComponentConfig]) -> Callable[[type[T]], type[T]]:
        if not (dataclasses.is_dataclass(config) and issubclass(config, ComponentConfig)):
            raise TypeError(f"{self.kind} {name!r}: config must be a ComponentConfig dataclass")

        def decorator(cls: type[T]) -> type[T]:
            if name in self._entries and self._entries[name][0] is not cls:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = (cls, config)
            STORED.update((cls, config))
            ConfigStore.instance().store(group=self.group, name=name, node=config(name=name))
            cls.registered_name = name  # type: ignore[attr-defined]
            return cls

        return decorator

    def names(self) -> list[str]:
        return sorted(self._entries)

    def names_with(self, flag: str) -> list[str]:
        """The registered names whose class sets `flag` (a class attribute) true."""
        return [n for n in self.names() if getattr(self._entries[n][0], flag)]

    def get(self, name: str) -> tuple[type[T], type[ComponentConfig]]:
        if name not in self._entries:
            raise ConfigError(
                f"{self.config_path}.name: unknown {self.kind} {name!r}; "
                f"registered: {', '.join(sorted(self._entries))}"
            )
        return self._entries[name]

    def build(self, cfg: ComponentConfig, *args: Any, **kwargs: Any) -> T:
        cls, _ = self.get(cfg.name)
        return cls(cfg, *args, **kwargs)
