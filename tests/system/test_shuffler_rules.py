"""The rules of a service's shape (issue 36; docs/design.md, "Shape of the code"), held for the shuffler:
servicer -> serde -> handler over a state. Each rule is a function of a package directory, so the curator's
tests can hold its service to the same ones; each is shown to fail on a package that breaks it.

- only the server, serde, wire and cli modules import the generated messages (``lac.common.v1``), type-only
  imports included;
- a servicer method (a method of a class named ``*Servicer``) is at most 6 statements, nested ones counted;
- no class over 300 lines and no module over 450 lines among the servicer, serde, state, lifecycle and handler
  modules;
- no module reads another object's underscore attribute (``x._y`` where ``x`` is not ``self`` or ``cls``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHUFFLER = ROOT / "shuffler" / "lac" / "shuffler"
PROTO_MODULES = ("server", "serde", "wire", "cli")  # the edges: what may import the generated messages
# The shuffler's servicer, serde, state, lifecycle and handler modules (docs/design.md, "Layout").
SHUFFLER_SHAPED = ("server", "serde", "state", "lifecycle", "intake", "releases", "forward", "shards", "status")
MAX_SERVICER_STATEMENTS = 6
MAX_CLASS_LINES = 300
MAX_MODULE_LINES = 450
# A named tuple's public methods carry an underscore only to stay clear of its field names.
NAMEDTUPLE_API = frozenset({"_make", "_asdict", "_replace", "_fields", "_field_defaults"})


def _modules(package: Path) -> list[Path]:
    return sorted(p for p in package.rglob("*.py") if "v1" not in p.relative_to(package).parts)


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def _name(package: Path, path: Path) -> str:
    return path.relative_to(package).with_suffix("").as_posix()


def proto_importers(package: Path, allowed: Iterable[str] = PROTO_MODULES) -> list[str]:
    """``module:line`` of each import of the generated messages (``lac.common.v1``) outside the ``allowed``
    modules (by file name), at any depth (inside functions and ``TYPE_CHECKING`` blocks too)."""
    out = []
    for path in _modules(package):
        if path.stem in allowed:
            continue
        for node in ast.walk(_tree(path)):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            if any(n == "lac.common.v1" or n.startswith("lac.common.v1.") for n in names):
                out.append(f"{_name(package, path)}:{node.lineno}")
    return out


def long_servicer_methods(package: Path, limit: int = MAX_SERVICER_STATEMENTS) -> list[str]:
    """``Class.method (n statements)`` of each method of a ``*Servicer`` class with more than ``limit``
    statements, counting those nested in ``with``, ``try``, ``if`` and loops."""
    out = []
    for path in _modules(package):
        for cls in ast.walk(_tree(path)):
            if not (isinstance(cls, ast.ClassDef) and cls.name.endswith("Servicer")):
                continue
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and fn.name != "__init__":
                    n = sum(isinstance(s, ast.stmt) for top in fn.body for s in ast.walk(top))
                    if n > limit:
                        out.append(f"{cls.name}.{fn.name} ({n} statements)")
    return out


def oversized(
    package: Path, modules: Iterable[str], class_lines: int = MAX_CLASS_LINES, module_lines: int = MAX_MODULE_LINES
) -> list[str]:
    """Each of ``modules`` (names relative to ``package``, without ``.py``) over ``module_lines`` lines, and each
    class in them over ``class_lines`` lines."""
    out = []
    for name in modules:
        path = package / f"{name}.py"
        text = path.read_text(encoding="utf-8")
        if (n := len(text.splitlines())) > module_lines:
            out.append(f"module {name} ({n} lines)")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.ClassDef) and (n := node.end_lineno - node.lineno + 1) > class_lines:
                out.append(f"class {name}.{node.name} ({n} lines)")
    return out


def foreign_underscore_reads(package: Path) -> list[str]:
    """``module:line x._y`` of each read of another object's underscore attribute (``x`` not ``self``/``cls``;
    dunders such as ``__name__`` and a named tuple's ``_make``, ``_asdict``... are public)."""
    out = []
    for path in _modules(package):
        for node in ast.walk(_tree(path)):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.endswith("__"):
                continue
            if node.attr in NAMEDTUPLE_API:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            out.append(f"{_name(package, path)}:{node.lineno} {ast.unparse(node)}")
    return out


# ------------------------------------------------------------------ the shuffler holds them


def test_only_the_edges_of_the_shuffler_import_the_generated_messages():
    assert proto_importers(SHUFFLER) == []


def test_shuffler_servicer_methods_are_at_most_six_statements():
    assert long_servicer_methods(SHUFFLER) == []


def test_shuffler_service_modules_and_classes_are_small():
    assert oversized(SHUFFLER, SHUFFLER_SHAPED) == []


def test_no_shuffler_module_reads_another_objects_underscore_attribute():
    assert foreign_underscore_reads(SHUFFLER) == []


def test_the_shuffler_has_no_service_module():
    """Issue 36: the one class that held every concern is gone (``lifecycle``, ``state`` and the handlers)."""
    assert not (SHUFFLER / "service.py").exists()


# ------------------------------------------------------------------ each rule can fail


BROKEN = """
from lac.common.v1 import shuffler_pb2


class Handle:
    def one(self, other):
        return other._secret + self._mine + type(other).__name__


class WideServicer:
    async def Submit(self, request, context, caller):
        a = 1
        with open("x") as f:
            b = f.read()
            if b:
                a += 1
        try:
            a += 2
        except ValueError:
            raise
        return a
"""


def test_each_rule_flags_a_package_that_breaks_it(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "intake.py").write_text(BROKEN + "\n" * 450, encoding="utf-8")
    (pkg / "serde.py").write_text("from lac.common.v1 import reports_pb2\n", encoding="utf-8")
    assert proto_importers(pkg) == ["intake:2"]  # serde may
    assert long_servicer_methods(pkg) == ["WideServicer.Submit (9 statements)"]
    assert oversized(pkg, ["intake", "serde"]) == ["module intake (471 lines)"]
    assert oversized(pkg, ["intake"], class_lines=5) == [
        "module intake (471 lines)",
        "class intake.WideServicer (12 lines)",
    ]
    assert foreign_underscore_reads(pkg) == ["intake:7 other._secret"]
