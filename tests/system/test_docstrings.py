"""Most public definitions of the five packages say what they are in a docstring.

Counted: module-level functions and classes, and the methods (properties included) of public classes,
whose names do not start with ``_``; ``@overload`` signatures are not definitions of their own. Generated
protobuf/gRPC modules are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("common", "client", "shuffler", "curator", "analyst", "suite")
MIN_SHARE = 0.85


def _is_overload(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(
        (isinstance(d, ast.Name) and d.id == "overload") or (isinstance(d, ast.Attribute) and d.attr == "overload")
        for d in node.decorator_list
    )


def _public(body: list[ast.stmt], where: str):
    """(qualified name, has a docstring) for each public definition in ``body``."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
            if not _is_overload(node):
                yield f"{where}.{node.name}", ast.get_docstring(node) is not None
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            yield f"{where}.{node.name}", ast.get_docstring(node) is not None
            yield from _public(node.body, f"{where}.{node.name}")


def source_files() -> list[Path]:
    return [path for pkg in PACKAGES for path in sorted((ROOT / pkg / "lac").rglob("*.py")) if "_pb2" not in path.name]


def public_definitions() -> list[tuple[str, bool]]:
    out = []
    for path in source_files():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        out.extend(_public(tree.body, str(path.relative_to(ROOT))))
    return out


def test_the_counter_sees_what_it_should():
    tree = ast.parse('''
def f():
    """doc"""
def _private(): pass
class C:
    def m(self): pass
    @property
    def p(self):
        """doc"""
    def __init__(self): pass
class _Hidden:
    def m(self): pass
@overload
def g(x: int) -> int: ...
def g(x): pass
''')
    assert dict(_public(tree.body, "m")) == {"m.f": True, "m.C": False, "m.C.m": False, "m.C.p": True, "m.g": False}


def test_public_definitions_have_docstrings():
    defs = public_definitions()
    assert len(defs) > 500 and len(source_files()) > 80  # the walk found the packages
    missing = [name for name, has_doc in defs if not has_doc]
    share = 1 - len(missing) / len(defs)
    assert share >= MIN_SHARE, (
        f"{share:.1%} of {len(defs)} public definitions have a docstring "
        f"(at least {MIN_SHARE:.0%} expected); without one:\n  " + "\n  ".join(missing)
    )
