"""The rules of a service's shape (issue 36, docs/design.md "Shape of the code"), checked on the curator's service
wing: only its server, serde and CLI modules import the generated messages; a servicer method is at most 6
statements; no class over 300 lines and no module over 450 among the servicer, serde, state, lifecycle and handler
modules; no module of the wing reads another object's underscore attribute. Each check is a function of a
package directory, so the shuffler's can use them too; each is shown failing on a small package written here."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ROOT / "curator" / "lac" / "curator" / "service"

GENERATED = "lac.common.v1"
MAX_SERVICER_STATEMENTS = 6
MAX_CLASS_LINES = 300
MAX_MODULE_LINES = 450


def _modules(package: Path) -> list[Path]:
    return sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def _name(path: Path, package: Path) -> str:
    return ".".join(path.relative_to(package).with_suffix("").parts)


def generated_message_importers(package: Path, allowed: set[str]) -> list[str]:
    """Modules of ``package`` (named relative to it, e.g. ``handlers.release``) outside ``allowed`` that import the
    generated protobuf modules, anywhere in them (inside functions and under TYPE_CHECKING too)."""
    out = []
    for path in _modules(package):
        name = _name(path, package)
        if name in allowed:
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module]
            else:
                continue
            if any(t == GENERATED or t.startswith(GENERATED + ".") for t in targets):
                out.append(f"{name}:{node.lineno}")
    return out


def _statements(body: list[ast.stmt]) -> int:
    """Statements in ``body``, nested ones included (an ``if`` and the two in its body are three); a docstring is
    not one."""
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return sum(1 for stmt in body for node in ast.walk(stmt) if isinstance(node, ast.stmt))


def long_servicer_methods(package: Path, limit: int = MAX_SERVICER_STATEMENTS) -> list[str]:
    """Methods of the ``...Servicer`` classes of ``package``'s modules with more than ``limit`` statements
    (``__init__`` aside)."""
    out = []
    for path in _modules(package):
        for cls in ast.walk(_tree(path)):
            if not (isinstance(cls, ast.ClassDef) and cls.name.endswith("Servicer")):
                continue
            for fn in cls.body:
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name != "__init__":
                    n = _statements(fn.body)
                    if n > limit:
                        out.append(f"{cls.name}.{fn.name}: {n} statements")
    return out


def oversized(
    package: Path, modules: set[str], class_lines: int = MAX_CLASS_LINES, module_lines: int = MAX_MODULE_LINES
) -> list[str]:
    """Modules of ``package`` matching ``modules`` (a name, or a folder's name for all modules in it) over
    ``module_lines`` lines, and classes in them over ``class_lines``."""
    out = []
    for path in _modules(package):
        name = _name(path, package)
        if name not in modules and name.split(".")[0] not in modules:
            continue
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > module_lines:
            out.append(f"{name}: {lines} lines")
        for cls in ast.walk(_tree(path)):
            if isinstance(cls, ast.ClassDef) and cls.end_lineno is not None:
                size = cls.end_lineno - cls.lineno + 1
                if size > class_lines:
                    out.append(f"{name}.{cls.name}: {size} lines")
    return out


def underscore_reads(package: Path) -> list[str]:
    """``x._y`` in ``package``'s modules where ``x`` is not ``self`` or ``cls`` (dunders such as ``__name__`` are
    not private)."""
    out = []
    for path in _modules(package):
        for node in ast.walk(_tree(path)):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            out.append(f"{_name(path, package)}:{node.lineno}: {ast.unparse(node)}")
    return out


# -- the curator ---------------------------------------------------------------------------------------------------


def test_only_the_curators_server_serde_and_cli_import_the_generated_messages():
    assert generated_message_importers(SERVICE, {"server", "serde", "cli"}) == []


def test_the_curators_servicer_methods_are_short():
    assert long_servicer_methods(SERVICE) == []
    assert long_servicer_methods(SERVICE, limit=1)  # the check sees the servicers' methods


def test_the_curators_service_rooms_are_small():
    rooms = {"server", "serde", "state", "lifecycle", "handlers"}
    assert {p.stem for p in (SERVICE / "handlers").glob("*.py")} >= {"ingest", "release", "query", "exports", "status"}
    assert oversized(SERVICE, rooms) == []
    assert oversized(SERVICE, rooms, class_lines=50, module_lines=100)  # the check sees them


def test_no_curator_service_module_reads_another_objects_underscore_attribute():
    """The service wing only, for now: the lower wings still have a few (a method reading another instance of its own
    class, ``os._exit``, Spark's active context), which item 3 of issue 36 moves anyway."""
    assert underscore_reads(SERVICE) == []


# -- each check can fail -------------------------------------------------------------------------------------------


def _package(tmp_path: Path, modules: dict[str, str]) -> Path:
    for name, text in modules.items():
        path = tmp_path / f"{name.replace('.', '/')}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


def test_the_checks_find_each_breach(tmp_path):
    servicer = (
        "class QueryServicer:\n"
        "    def __init__(self, state):\n        self.state = state\n\n"
        "    async def Short(self, request, context, caller):\n"
        '        """One handler call."""\n'
        "        return serde.reply(await handler.run(self.state, serde.parse(request)))\n\n"
        "    async def Long(self, request, context, caller):\n"
        "        a = serde.parse(request)\n"
        "        if a:\n            b = 1\n            c = 2\n"
        "        for x in a:\n            yield x\n"
        "        return\n"
    )
    package = _package(
        tmp_path,
        {
            "server": servicer + "from lac.common.v1 import curator_pb2\n",
            "serde": "from lac.common.v1 import curator_pb2\n",
            "handlers.release": "import lac.common.v1.curator_pb2\n\ndef f(state):\n    return state._db, self._ok\n",
            "state": "class State:\n" + "    x = 1\n" * 5 + "\n" * 3,
            "other": "\n" * 20,
        },
    )
    assert generated_message_importers(package, {"server", "serde"}) == ["handlers.release:1"]
    assert long_servicer_methods(package) == ["QueryServicer.Long: 7 statements"]
    assert oversized(package, {"state", "handlers"}, class_lines=5, module_lines=8) == [
        "state: 9 lines",
        "state.State: 6 lines",
    ]
    assert underscore_reads(package) == ["handlers.release:4: state._db"]
