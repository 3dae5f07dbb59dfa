"""`stalebench list`: every component a run can name, with one line each, plugins
included (the registries after `plugins.load`, and the YAML presets and sweeps)."""

from __future__ import annotations

import re

from stalebench import plugins
from stalebench.errors import ConfigError
from stalebench.registry import REGISTRIES, Registry

# a period after these does not end a sentence ("He et al. 2016", "e.g. BSP")
ABBREVIATIONS = ("et al", "e.g", "i.e", "cf", "vs", "Fig", "Eq", "resp", "approx")


def first_line(text: str | None, width: int = 96) -> str:
    """The first sentence of a docstring or comment, cut to `width` characters."""
    paragraph = " ".join((text or "").strip().split("\n\n")[0].split())
    sentence = paragraph.rstrip(".")
    for end in re.finditer(r"\.\s", paragraph):
        if not paragraph[: end.start()].endswith(ABBREVIATIONS):
            sentence = paragraph[: end.start()]
            break
    return sentence if len(sentence) <= width else sentence[: width - 1].rstrip() + "…"


def yaml_summary(text: str) -> str:
    """A preset's opening comment (after `# @package`), cut to its first sentence."""
    comment = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        if "@package" not in line:
            comment.append(line.lstrip("# ").strip())
    return first_line("\n".join(comment))


def registered(registry: Registry) -> list[tuple[str, str]]:
    return [(n, first_line(registry.get(n)[0].__doc__)) for n in registry.names()]


def presets(group: str) -> list[tuple[str, str]]:
    """The YAML configs of a group: stalebench's and the plugins'."""
    found = plugins.yaml_files(group)
    return sorted((f.name.removesuffix(".yaml"), yaml_summary(f.read_text())) for f in found)


def sections() -> list[tuple[str, list[tuple[str, str]]]]:
    """Engines, every kind of algorithm part (a plugin's own kinds included), presets,
    models, datasets, clusters and sweeps."""
    plugins.load()

    def named(group: str) -> tuple[str, list[tuple[str, str]]]:
        registry = REGISTRIES[group]
        return f"{registry.kind}s ({group}=)", registered(registry)

    parts = [named(group) for group in REGISTRIES if group.startswith("algorithm/")]
    return [
        named("engine"),
        *parts,
        ("algorithm presets (algorithm=)", presets("algorithm")),
        named("model"),
        named("dataset"),
        ("cluster profiles (cluster=)", presets("cluster")),
        ("sweeps (+sweep=)", presets("sweep")),
    ]


def groups(chosen: list[tuple[str, list]] | None = None) -> list[str]:
    """The groups `stalebench list <group>` takes, as each section's title names it (of
    `chosen` sections, or of every one)."""
    return [title.rpartition("(")[2].strip("+=)") for title, _ in chosen or sections()]


def render(group: str | None = None) -> str:
    """Every section, or only `group`'s (a ConfigError naming the groups when it is none);
    an algorithm part's group is also found by its last name (`update`: algorithm/update)."""
    chosen = sections()
    if group is not None:
        names = groups(chosen)
        parts = [g for g in names if g.endswith(f"/{group}")]
        group = parts[0] if len(parts) == 1 and group not in names else group
        chosen = [section for section, name in zip(chosen, names, strict=True) if name == group]
        if not chosen:
            import difflib

            close = difflib.get_close_matches(group, names, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigError(f"list: no group {group!r}; {hint}groups: {', '.join(names)}")
    out = []
    for title, rows in chosen:
        out.append(title)
        width = max((len(n) for n, _ in rows), default=0)
        out += [f"  {name:<{width}}  {text}".rstrip() for name, text in rows]
    return "\n".join(out)
