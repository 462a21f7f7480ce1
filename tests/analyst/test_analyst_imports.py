"""The analyst's distribution stays thin: no module of ``lac.analyst`` imports server code (``lac.curator``,
``lac.shuffler``, the server kit of ``lac.common``) or scipy, at load time or inside a function, and importing
it loads none of them, nor pandas or pyarrow (extras, imported on first use)."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "analyst" / "lac" / "analyst"
FORBIDDEN = (
    "lac.curator",
    "lac.shuffler",
    "lac.client",
    "lac.suite",
    "lac.common.server",
    "lac.common.metrics",
    "scipy",
)


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports anywhere (load time, functions, TYPE_CHECKING blocks alike)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_no_module_imports_server_code_or_scipy():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert modules
    bad = {
        f"{p.relative_to(ROOT)}: {m}"
        for p in modules
        for m in _imported(p)
        if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)
    }
    assert not bad, sorted(bad)


def test_import_loads_no_server_code_pandas_or_pyarrow():
    check = (
        "import sys, lac.analyst\n"
        f"loaded = {{m for m in sys.modules if m.split('.')[0] in ('scipy', 'pandas', 'pyarrow', 'matplotlib') "
        f"or m.startswith({FORBIDDEN[:4]!r})}}\n"
        "assert not loaded, sorted(loaded)\n"
    )
    subprocess.run([sys.executable, "-c", check], check=True, timeout=60)


def test_the_distribution_depends_on_no_server_package():
    project = tomllib.loads((ROOT / "analyst" / "pyproject.toml").read_text())["project"]
    names = [d.split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip() for d in project["dependencies"]]
    assert names == ["lac-common", "grpcio", "protobuf", "numpy"], names
    assert all("[" not in d for d in project["dependencies"])  # not lac-common[server]
    assert "pandas" in str(project["optional-dependencies"]["frames"])
