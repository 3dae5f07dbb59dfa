"""`stalebench list`: every component a run can name, with one line each, plugins
included (the registries after `plugins.load`, and the YAML presets and sweeps)."""

from __future__ import annotations

from stalebench import plugins
from stalebench.registry import REGISTRIES, Registry


def first_line(text: str | None, width: int = 96) -> str:
    """The first sentence of a docstring or comment, cut to `width` characters."""
    paragraph = " ".join((text or "").strip().split("\n\n")[0].split())
    sentence = paragraph.split(". ")[0].rstrip(".")
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


def render() -> str:
    out = []
    for title, rows in sections():
        out.append(title)
        width = max((len(n) for n, _ in rows), default=0)
        out += [f"  {name:<{width}}  {text}".rstrip() for name, text in rows]
    return "\n".join(out)
