"""The package graph has no import cycles: a module imported at load time by another never imports
it back (directly or through others). Imports inside functions (deliberately lazy) and under
``TYPE_CHECKING`` are not load-time imports and are not counted. The curator is held to more: no
circle among its modules even counting the imports inside functions (only ``TYPE_CHECKING`` ones, which
never run, are left out), and its wings are layered in one declared order (``CURATOR_WING_ORDER``,
docs/design.md): a wing imports only wings below it, counting the imports inside functions and the type-only
ones under ``TYPE_CHECKING`` too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("common", "client", "shuffler", "curator", "analyst", "suite")
# The curator's wings, bottom first (docs/design.md, "Layout"): a wing may import only the wings before it.
CURATOR_WING_ORDER = ("base", "store", "engines", "ingest", "release", "mechanisms", "runner", "lm", "service")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg / "lac").rglob("*.py"):
            rel = path.relative_to(ROOT / pkg).with_suffix("")
            if "v1" in rel.parts:  # generated protobuf code
                continue
            name = ".".join(rel.parts)
            out[name.removesuffix(".__init__")] = path
    return out


def _load_time_imports(path: Path, name: str, known: set[str], lazy: bool = False, type_only: bool = False) -> set[str]:
    """Modules of ``known`` that ``name`` imports at load time (module level, not under TYPE_CHECKING);
    with ``lazy``, also those it imports inside functions and classes; with ``type_only``, also those under
    TYPE_CHECKING (which never run, but still tie a module to another)."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()

    def resolve(module: str | None, level: int) -> str:
        if not level:
            return module or ""
        base = name.split(".") if is_pkg else name.split(".")[:-1]
        base = base[: len(base) - (level - 1)]
        return ".".join(base + ([module] if module else []))

    def visit(stmts):
        for node in stmts:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.body + node.orelse if type_only else node.orelse)
                continue
            if isinstance(node, (ast.If, ast.Try, ast.With)) or (
                lazy and not isinstance(node, (ast.Import, ast.ImportFrom)) and hasattr(node, "body")
            ):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    for child in getattr(node, field, []) or []:
                        visit(child.body if isinstance(child, ast.ExceptHandler) else [child])
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mod = resolve(node.module, node.level)
                targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in known:  # `import lac.x.y` loads lac.x.y; a name inside a module is that module
                    t = t.rpartition(".")[0]
                if t and t != name:
                    found.add(t)

    visit(tree.body)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return out


def test_no_import_cycles():
    modules = _modules()
    known = set(modules)
    graph = {}
    for name, path in modules.items():
        # a package's own __init__ being imported by its submodules is not a cycle worth flagging
        graph[name] = {m for m in _load_time_imports(path, name, known) if not name.startswith(m + ".")}
    assert _cycles(graph) == []


def test_no_circle_among_the_curators_modules_even_lazily():
    """E.g. the engine selects the Spark engine (an import inside ``create_engine``); ``spark.py`` names
    the engine's ``Parts`` for type checking only, so the dependency goes one way."""
    modules = _modules()
    known = set(modules)
    graph = {
        name: {
            m
            for m in _load_time_imports(path, name, known, lazy=True)
            if m.startswith("lac.curator") and not name.startswith(m + ".")
        }
        for name, path in modules.items()
        if name.startswith("lac.curator")
    }
    assert "lac.curator.engines.spark" in graph["lac.curator.engines.local"]  # the checker sees lazy imports
    assert _cycles(graph) == []


def test_the_checker_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _curator_wing(module: str) -> str | None:
    """The wing of a curator module (``lac.curator.<wing>...``); None for the package's own ``__init__``."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["lac", "curator"] else None


def _wing_graph() -> dict[str, set[str]]:
    """Which curator wings each curator wing imports (imports inside functions and under TYPE_CHECKING too)."""
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        wing = _curator_wing(name)
        if wing is None:
            continue
        deps = graph.setdefault(wing, set())
        for m in _load_time_imports(path, name, known, lazy=True, type_only=True):
            other = _curator_wing(m)
            if other is not None and other != wing:
                deps.add(other)
    return graph


def _layering_violations(graph: dict[str, set[str]], order: tuple[str, ...]) -> list[str]:
    """Every edge of ``graph`` that does not point down ``order`` (bottom first), and every wing not in ``order``."""
    rank = {w: i for i, w in enumerate(order)}
    out = [f"{w}: not in the declared order" for w in sorted(graph) if w not in rank]
    for wing, deps in sorted(graph.items()):
        for dep in sorted(deps):
            if wing in rank and dep in rank and rank[dep] >= rank[wing]:
                out.append(f"{wing} -> {dep}")
    return out


def test_the_curators_wings_are_layered():
    """base -> store -> engines -> ingest -> release -> mechanisms -> runner -> lm -> service, read bottom up:
    e.g. ingest on Spark runs its jobs on the Spark engine's session and hands the store its quarantine, the
    algorithms (release) read the store's segments and run their folds on an engine, the mechanisms are built from
    the algorithms, the runner runs a request through the mechanisms' registry, and only the service sees
    everything."""
    graph = _wing_graph()
    assert set(graph) == set(CURATOR_WING_ORDER)
    # the checker sees the edges it orders
    assert {"store", "engines"} <= graph["release"] and {"store", "engines"} <= graph["ingest"]
    assert "mechanisms" in graph["runner"]
    assert _layering_violations(graph, CURATOR_WING_ORDER) == []


def test_the_layering_check_finds_an_upward_import():
    order = ("base", "store", "release")
    assert _layering_violations({"base": set(), "store": {"base"}, "release": {"store", "base"}}, order) == []
    assert _layering_violations({"base": {"release"}, "store": {"base"}, "release": set()}, order) == [
        "base -> release"
    ]
    # a cycle between two wings breaks the order whichever is declared first
    assert _layering_violations({"base": set(), "store": {"release"}, "release": {"store"}}, order) == [
        "store -> release"
    ]
    assert _layering_violations({"base": set(), "extra": {"base"}}, order) == ["extra: not in the declared order"]


def test_the_wing_graph_counts_imports_inside_functions():
    """The service's CLI imports the runner's offline path inside a function only; the graph has that edge."""
    modules = _modules()
    path = modules["lac.curator.service.cli"]
    eager = _load_time_imports(path, "lac.curator.service.cli", set(modules))
    lazy = _load_time_imports(path, "lac.curator.service.cli", set(modules), lazy=True)
    assert "lac.curator.runner.offline" in lazy - eager


def test_the_wing_graph_counts_type_only_imports(tmp_path):
    """An import under TYPE_CHECKING ties a wing to another as much as one that runs: the layering counts it."""
    path = tmp_path / "chunks.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from lac.curator.service.config import CuratorConfig\n"
    )
    known = {"lac.curator.service.config"}
    assert _load_time_imports(path, "lac.curator.ingest.chunks", known, lazy=True) == set()
    assert _load_time_imports(path, "lac.curator.ingest.chunks", known, lazy=True, type_only=True) == known
