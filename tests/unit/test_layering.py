"""The architecture's rules kept by tests: algorithm names only in stalebench/algorithms/,
engine names only in the engine's own module, imports pointing down only (the contracts
of `lint-imports` in pyproject.toml), and no circle of imports."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stalebench.algorithms import BARRIERS, UPDATES
from stalebench.algorithms.local import INNER, OUTER
from stalebench.algorithms.pipeline import OPTIMIZERS, SCHEDULES
from stalebench.config import ENGINES, LOGGERS
from stalebench.plugins import load as load_plugins

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "stalebench"

load_plugins()


def modules(exclude=()):
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if not any(rel.parts[: len(e)] == e for e in exclude):
            yield path, ast.parse(path.read_text())


def constants(tree, names):
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
    ]


def test_no_algorithm_name_outside_the_algorithms_package():
    names = set(BARRIERS.names()) | set(UPDATES.names()) | set(OPTIMIZERS.names()) | set(SCHEDULES)
    names |= set(INNER.names()) | set(OUTER.names())
    found = [
        f"{path.relative_to(PACKAGE)}:{node.lineno} {node.value!r}"
        for path, tree in modules(exclude=[("algorithms",)])
        for node in constants(tree, names)
    ]
    assert not found, found


def test_no_engine_name_outside_its_own_module():
    """`if cfg.engine == "ps"` anywhere but in the ps engine is a seam left open: the
    runtime, the experiment and the CLI ask the engine, they never test its name."""
    found = []
    for name in ENGINES.names():
        engine_cls, _ = ENGINES.get(name)
        module = engine_cls.__module__.split(".")  # stalebench.engines.<name>[...]
        if module[0] != "stalebench":
            continue  # registered by a test in this process
        own = tuple(module[1:3])  # ("engines", "<name>"): its module or package
        own_file = (*own[:-1], own[-1] + ".py")
        for path, tree in modules(exclude=[own, own_file]):
            hits = constants(tree, {name}) if name not in LOGGERS else engine_tests(tree, name)
            found += [f"{path.relative_to(PACKAGE)}:{n.lineno} {name!r}" for n in hits]
    assert not found, found


def engine_tests(tree, name):
    """A name that is also a logger's (`local`) is a word of the logger's vocabulary too:
    only a comparison of it with something called engine is the engine's name."""
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and "engine" in ast.unparse(node)
        and constants(node, {name})
    ]


def test_an_engine_name_shared_with_a_logger_is_still_caught():
    tree = ast.parse('if cfg.engine.name == "local":\n    pass\nlogger = "local"\n')
    assert [n.lineno for n in engine_tests(tree, "local")] == [1]


def imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_pure_parts_start_no_process():
    pure = [*(PACKAGE / "algorithms").rglob("*.py")]
    pure += [PACKAGE / "engines" / "ps" / "state.py", PACKAGE / "engines" / "pipeline" / "stage.py"]
    for path in pure:
        bad = [
            m
            for m in imports(ast.parse(path.read_text()))
            if m.startswith(("torch.distributed", "torch.multiprocessing", "stalebench.runtime"))
        ]
        assert not bad, (path.name, bad)


def test_imports_point_down():
    """The layers of pyproject.toml's [tool.importlinter]: runtime never imports an engine
    or the experiment, algorithms no engine or runtime, reports no engine, runtime or torch
    (`lint-imports` from the repository root is the same check)."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail("lint-imports is not installed: pip install -e '.[test]'")
    out = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def import_graph():
    """module -> the stalebench modules it imports (at any depth of the file: function-level
    imports count), resolved to modules that exist."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        names[name] = path
    graph = {}
    for name, path in names.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                base = node.module
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.add(full if full in names else base)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
        graph[name] = {t for t in targets if t in names and t != name}
    return graph


def find_cycles(graph):
    """The circles of a graph: its strongly connected components of more than one module
    (Tarjan's algorithm)."""
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                cycles.append(sorted(scc))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def test_no_circle_of_imports():
    assert not find_cycles(import_graph())


def test_the_cycle_check_finds_a_circle():
    """The check above can fail: the circle this layout removed (the runtime importing
    the experiment back) is found when put back."""
    graph = import_graph()
    assert "stalebench.runtime.launch" in graph["stalebench.experiment"]
    graph["stalebench.runtime.launch"].add("stalebench.experiment")
    assert ["stalebench.experiment", "stalebench.runtime.launch"] in [
        [m for m in c if m in ("stalebench.experiment", "stalebench.runtime.launch")]
        for c in find_cycles(graph)
    ]


SHARED_ENGINE_MODULES = {"base", "common", "parallel", "rounds"}  # the layer every engine may use


def test_no_engine_imports_another_engines_package():
    """An engine (a package under engines/, or a module there with its helpers: allreduce's
    overlap.py) imports the shared layer and itself, never another engine."""
    own = {"overlap": "allreduce"}  # a helper module of an engine, not an engine
    found = []
    for path, tree in modules():
        rel = path.relative_to(PACKAGE).parts
        if rel[0] != "engines" or len(rel) < 2:
            continue
        me = own.get(Path(rel[1]).stem, Path(rel[1]).stem)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "stalebench.engines."
            ):
                other = node.module.split(".")[2]
                other = own.get(other, other)
                if other not in SHARED_ENGINE_MODULES | {me}:
                    found.append(f"{'/'.join(rel)}:{node.lineno} imports {node.module}")
    assert not found, found


def test_the_number_of_workers_has_one_source_the_engines():
    """Engines and runtimes read how many workers compute from the engine (`job.num_workers`,
    `Engine.num_workers`), never from `cluster.num_workers` directly: an engine whose
    computing processes are not the cluster's workers (a pipeline's stages, one process)
    would otherwise shard, count and build by the wrong number. Only the base's default reads
    the cluster (and messages, which name the key the user set)."""
    found = []
    for path, tree in modules():
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] not in ("engines", "runtime") or rel == Path("engines/base.py"):
            continue
        quoted = {
            id(n) for f in ast.walk(tree) if isinstance(f, ast.JoinedStr) for n in ast.walk(f)
        }
        for node in ast.walk(tree):
            if id(node) in quoted:
                continue
            if isinstance(node, ast.Attribute) and node.attr == "num_workers":
                if isinstance(node.value, ast.Attribute) and node.value.attr == "cluster":
                    found.append(f"{rel}:{node.lineno}")
    assert not found, found
