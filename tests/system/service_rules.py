"""The rules of a service's shape (issue 36; docs/design.md, "Shape of the code"): servicer -> serde -> handler over a
state. Each rule is a function of a package directory (``test_service_rules.py`` holds both services to them and
shows each failing on a package that breaks it):

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

GENERATED = "lac.common.v1"
EDGES = ("server", "serde", "wire", "cli")  # the modules that may import the generated messages
MAX_SERVICER_STATEMENTS = 6
MAX_CLASS_LINES = 300
MAX_MODULE_LINES = 450
# A named tuple's public methods carry an underscore only to stay clear of its field names.
NAMEDTUPLE_API = frozenset({"_make", "_asdict", "_replace", "_fields", "_field_defaults"})
# Underscore names of other libraries that have no public equivalent, each with why it is read.
FOREIGN_ALLOWED = {
    "os._exit": "the standard library's way to end a forked worker at once, without running the parent's handlers",
    "SparkContext._active_spark_context": "pyspark has no public test for a context running in another thread",
}


def _modules(package: Path) -> list[Path]:
    return sorted(p for p in package.rglob("*.py") if not {"v1", "__pycache__"} & set(p.relative_to(package).parts))


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def _name(package: Path, path: Path) -> str:
    return ".".join(path.relative_to(package).with_suffix("").parts)


def proto_importers(package: Path, allowed: Iterable[str] = EDGES) -> list[str]:
    """``module:line`` of each import of the generated messages outside the ``allowed`` modules (by file name), at
    any depth (inside functions and ``TYPE_CHECKING`` blocks too)."""
    out = []
    for path in _modules(package):
        if path.stem in allowed:
            continue
        for node in ast.walk(_tree(path)):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == GENERATED or n.startswith(GENERATED + ".") for n in names):
                out.append(f"{_name(package, path)}:{node.lineno}")
    return out


def long_servicer_methods(package: Path, limit: int = MAX_SERVICER_STATEMENTS) -> list[str]:
    """``Class.method (n statements)`` of each method of a ``*Servicer`` class with more than ``limit`` statements,
    counting those nested in ``with``, ``try``, ``if`` and loops (a docstring is not one)."""
    out = []
    for path in _modules(package):
        for cls in ast.walk(_tree(path)):
            if not (isinstance(cls, ast.ClassDef) and cls.name.endswith("Servicer")):
                continue
            for fn in cls.body:
                if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) or fn.name == "__init__":
                    continue
                body = fn.body
                if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                    body = body[1:]
                n = sum(isinstance(s, ast.stmt) for top in body for s in ast.walk(top))
                if n > limit:
                    out.append(f"{cls.name}.{fn.name} ({n} statements)")
    return out


def oversized(
    package: Path, rooms: Iterable[str], class_lines: int = MAX_CLASS_LINES, module_lines: int = MAX_MODULE_LINES
) -> list[str]:
    """Each module of ``rooms`` (names relative to ``package`` without ``.py``; a subpackage stands for all its
    modules) over ``module_lines`` lines, and each class in them over ``class_lines`` lines."""
    out = []
    for room in rooms:
        path = package / room
        for module in sorted(path.glob("*.py")) if path.is_dir() else [path.with_suffix(".py")]:
            text = module.read_text(encoding="utf-8")
            name = _name(package, module)
            if (n := len(text.splitlines())) > module_lines:
                out.append(f"module {name} ({n} lines)")
            for node in ast.walk(ast.parse(text, str(module))):
                if isinstance(node, ast.ClassDef) and (n := node.end_lineno - node.lineno + 1) > class_lines:
                    out.append(f"class {name}.{node.name} ({n} lines)")
    return out


def foreign_underscore_reads(package: Path) -> list[str]:
    """``module:line x._y`` of each read of another object's underscore attribute (``x`` not ``self``/``cls``;
    dunders such as ``__name__`` and a named tuple's ``_make``, ``_asdict``... are public; ``FOREIGN_ALLOWED`` lists the
    other libraries' that have no public equivalent)."""
    out = []
    for path in _modules(package):
        for node in ast.walk(_tree(path)):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.endswith("__"):
                continue
            if node.attr in NAMEDTUPLE_API or ast.unparse(node) in FOREIGN_ALLOWED:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            out.append(f"{_name(package, path)}:{node.lineno} {ast.unparse(node)}")
    return out
