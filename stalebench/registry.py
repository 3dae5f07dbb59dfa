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


class Registry(Generic[T]):
    def __init__(self, kind: str, group: str, config_path: str):
        self.kind = kind  # e.g. "barrier"
        self.group = group  # Hydra config group, e.g. "algorithm/barrier"
        self.config_path = config_path  # dotted config key, e.g. "algorithm.barrier"
        self._entries: dict[str, tuple[type[T], type[ComponentConfig]]] = {}

    def register(self, name: str, config: type[ComponentConfig]) -> Callable[[type[T]], type[T]]:
        if not (dataclasses.is_dataclass(config) and issubclass(config, ComponentConfig)):
            raise TypeError(f"{self.kind} {name!r}: config must be a ComponentConfig dataclass")

        def decorator(cls: type[T]) -> type[T]:
            if name in self._entries and self._entries[name][0] is not cls:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = (cls, config)
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
