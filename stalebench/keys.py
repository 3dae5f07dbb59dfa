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
would ignore it), refused the same way."""

from __future__ import annotations

import difflib
import functools

from omegaconf import DictConfig, OmegaConf

from stalebench.errors import ConfigError


def schema() -> tuple[frozenset[str], frozenset[str]]:
    """(every key path a schema has, the paths of free-form mappings under which any key
    goes), from the ConfigStore (plugins loaded and configs registered first); read again
    whenever a component has been registered since."""
    from hydra.core.config_store import ConfigStore

    def stamp(node: dict) -> tuple:
        return tuple((k, stamp(v) if isinstance(v, dict) else 0) for k, v in node.items())

    return _schema(stamp(ConfigStore.instance().repo))


@functools.lru_cache(maxsize=4)
def _schema(stamp: tuple) -> tuple[frozenset[str], frozenset[str]]:
    from hydra.core.config_store import ConfigStore

    keys: set[str] = set()
    open_: set[str] = set()

    def walk(node: DictConfig, prefix: str) -> None:
        for key in node.keys():
            path = f"{prefix}{key}"
            keys.add(path)
            value = node._get_node(key)
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
    return frozenset(keys), frozenset(open_)


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
    """Refuse an override of a key no schema has, naming it and the nearest valid keys."""
    known, open_ = schema()
    for arg in argv:
        found = _key(arg)
        if found is None:
            continue
        key, appends = found
        if key in groups or key in known:
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
