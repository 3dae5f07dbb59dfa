"""The config keys a command line may set, read from the schema in Hydra's ConfigStore (the
run's `RunConfig` and every registered component's config, a plugin's included), so that a
key that exists nowhere is refused in one line with the nearest valid ones — before Hydra
composes anything, and before torch is imported.

A key is known when some schema has it: `budget.max_wall_s`, `model.hidden` (the mlp's; a
key of another choice than the one selected is left to Hydra, which names it), or anything
under a free-form mapping (`sweep.params.*`). Group choices (`model=cnn`, `+sweep/arms/...`)
and `hydra.*` are not keys here (`cli.check_choices` checks names), nor is `+name=value`
without a dot (a group from another search path, `hydra.searchpath`). Hydra's
`+key.sub=value` appends a key: for a key no schema has, that is the same mistake (the run
would ignore it), refused the same way.

A value of the wrong type for its key (`cluster.num_workers=four`, `seed=1.5`) is refused
here too, in one line naming the key, the value and the type the schema gives it: Hydra
would refuse it only while composing, in several lines of its own."""

from __future__ import annotations

import copy
import difflib
import functools

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf, ValueNode
from omegaconf.errors import ValidationError

from stalebench.errors import ConfigError


def schema() -> tuple[frozenset[str], frozenset[str], dict[str, tuple]]:
    """(every key path a schema has, the paths of free-form mappings under which any key
    goes, the typed nodes each path has in the schemas that have it), from the ConfigStore
    (plugins loaded and configs registered first); read again whenever a component has been
    registered since."""
    from hydra.core.config_store import ConfigStore

    def stamp(node: dict) -> tuple:
        return tuple((k, stamp(v) if isinstance(v, dict) else 0) for k, v in node.items())

    return _schema(stamp(ConfigStore.instance().repo))


@functools.lru_cache(maxsize=4)
def _schema(stamp: tuple) -> tuple[frozenset[str], frozenset[str], dict[str, tuple]]:
    from hydra.core.config_store import ConfigStore

    keys: set[str] = set()
    open_: set[str] = set()
    typed: dict[str, list] = {}

    def walk(node: DictConfig, prefix: str) -> None:
        for key in node.keys():
            path = f"{prefix}{key}"
            keys.add(path)
            value = node._get_node(key)
            if isinstance(value, ValueNode | ListConfig):
                typed.setdefault(path, []).append(value)
            if isinstance(value, DictConfig):
                if value._is_missing() or value._is_none():
                    continue  # a group's slot (model: ???): its choices are walked below
                if OmegaConf.get_type(value) in (dict, None):
                    open_.add(path)
                else:
                    walk(value, path + ".")

    def groups(repo: dict, prefix: str) -> None:
        for name, item in repo.items():
            if isinstance(item, dict):
                if name != "hydra":
                    groups(item, f"{prefix}{name}/")
            elif name.endswith(".yaml") and isinstance(item.node, DictConfig):
                if prefix:
                    walk(item.node, prefix.replace("/", "."))
                elif name == "stalebench.yaml":  # the run's own schema
                    walk(item.node, "")

    groups(ConfigStore.instance().repo, "")
    return frozenset(keys), frozenset(open_), {k: tuple(v) for k, v in typed.items()}


def _key(arg: str) -> tuple[str, bool] | None:
    """The key an override sets and whether it appends (`+`), or None for what is not a
    key (an option, a group's choice, hydra's own)."""
    if arg.startswith("-") or "=" not in arg and not arg.startswith("~"):
        return None
    key = arg.split("=", 1)[0]
    appends = key.startswith("+")
    key = key.lstrip("+~")
    if "/" in key or "@" in key or key.startswith("hydra.") or key == "hydra":
        return None
    return key, appends


def nearest(key: str, known: frozenset[str]) -> list[str]:
    """The known keys nearest `key`: its siblings (the same parent) nearest it, else the
    keys anywhere whose last part is nearest its last part (`lr`: algorithm.update.lr)."""
    parent, _, leaf = key.rpartition(".")
    siblings = [k for k in known if k.rpartition(".")[0] == parent]
    close = difflib.get_close_matches(key, siblings, n=2, cutoff=0.6)
    if close:
        return close
    leaves = {k.rpartition(".")[2] for k in known}
    near = difflib.get_close_matches(leaf, sorted(leaves), n=1, cutoff=0.75)
    return sorted(k for k in known if near and k.rpartition(".")[2] == near[0])[:4]


def check_keys(argv: list[str], groups: set[str]) -> None:
    """Refuse an override of a key no schema has, naming it and the nearest valid keys, and
    one whose value the key's type refuses (`check_type`)."""
    known, open_, typed = schema()
    for arg in argv:
        found = _key(arg)
        if found is None:
            continue
        key, appends = found
        if key in groups:
            continue
        if key in known:
            if key in typed and not arg.startswith("~"):
                check_type(arg, key, typed[key])
            continue
        if appends and "." not in key:
            continue  # `+group=option`: a group of a search path's (hydra.searchpath)
        parent = key.rpartition(".")[0]
        if any(key.startswith(p + ".") for p in open_):
            continue
        if parent in known and not any(k.startswith(parent + ".") for k in known):
            continue  # an item of a list (cluster.faults.0): Hydra says what is wrong
        guess = nearest(key, known)
        under = sorted(k.rpartition(".")[2] for k in known if k.rpartition(".")[0] == parent)
        if guess:
            hint = f"; did you mean {' or '.join(guess)}?"
        else:
            hint = f" ({parent or 'the top level'} has: {', '.join(under)})" if under else ""
        raise ConfigError(
            f"{key}: no such config key{hint}"
            + (" (a leading + adds a key; none by that name exists)" if appends else "")
        )


_NAMES = {"IntegerNode": "an integer", "FloatNode": "a number", "BooleanNode": "true or false"}
_ITEMS = {int: "integers", float: "numbers", bool: "booleans", str: "strings"}


def check_type(arg: str, key: str, nodes: tuple) -> None:
    """Refuse `arg` (an override of `key`) when a value it gives — each of a sweep's
    (`seed=0,1.5`) — is one that none of the key's typed `nodes` (a key of several schemas
    has several) takes, as Hydra would on composing, converting as it does (`'4'` is an
    integer); interpolations, ranges and lists of structured items are left to Hydra."""
    parser = OverridesParser.create()
    try:
        override = parser.parse_override(arg)
        if isinstance(override.value(), ChoiceSweep):  # a job's value each, as Hydra splits it
            values = [
                parser.parse_override(f"{key}={item}").value()
                for item in override.sweep_string_iterator()
            ]
        else:
            values = [] if override.is_sweep_override() else [override.value()]
    except HydraException as exc:
        raise ConfigError(f"{arg}: not an override Hydra can read: {_first_line(exc)}") from None
    if any(isinstance(node, ListConfig) and not _items(node) for node in nodes):
        return  # a list of structured items (cluster.faults): Hydra says what is wrong
    for value in values:
        if not any(_takes(node, value) for node in nodes):
            raise ConfigError(f"{key} must be {_expected(nodes)}, got {_shown(value)}")


def _takes(node, value) -> bool:
    try:
        copy.deepcopy(node)._set_value(value)
    except ValidationError:
        return False
    return True


def _expected(nodes: tuple) -> str:
    kinds = []
    for node in nodes:
        if isinstance(node, ListConfig):
            kind = f"a list of {_items(node)}"
        else:
            kind = _NAMES.get(type(node).__name__, "a string")
        kinds += [kind] if kind not in kinds else []
    optional = any(node._is_optional() for node in nodes)
    return " or ".join(kinds + (["null"] if optional else []))


def _items(node: ListConfig) -> str | None:
    """What a list's items are, when they are plain values (None: structured items)."""
    return _ITEMS.get(node._metadata.element_type)


def _shown(value) -> str:
    """A value as the command line would spell it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, str) else str(value)


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
