"""The tests' own layout (tests/README.md): any folder, subset or order of the suite collects, and a
role's tests do not depend on the umbrella package or on roles they do not talk to."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
CURATOR = TESTS.parent / "curator" / "lac" / "curator"
# The curator's wings (docs/design.md, "Layout"): a newcomer sees them from the listing.
CURATOR_WINGS = {"base", "engines", "ingest", "lm", "mechanisms", "release", "runner", "service", "store"}
ROLES = ("common", "client", "shuffler", "curator", "analyst")
# The peer a role's tests may import besides lac.common and the role itself: the one they drive as a real
# counterpart (the client's tests register a token on a real shuffler; the shuffler's use the SDK as caller;
# the curator's sample the local channel with the SDK's real mechanism and call it with the analyst's client, which
# its `lac curator` commands use; the analyst's run a real curator).
PEERS = {
    "common": (),
    "client": ("shuffler",),
    "shuffler": ("client",),
    "curator": ("client", "analyst"),
    "analyst": ("curator",),
}


def _modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if p.name != "conftest.py" and "__pycache__" not in p.parts)


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module


def test_module_names_are_unique_across_folders():
    """pytest's default import mode puts each test folder on sys.path and imports modules by their base
    name: two test_x.py (or two helpers of one name) in different folders clash, depending on order."""
    clashes = {name: n for name, n in Counter(p.stem for p in _modules()).items() if n > 1}
    assert not clashes, clashes
    assert not list(TESTS.rglob("__init__.py"))


def test_no_module_imports_a_conftest():
    """Every conftest.py is a module named ``conftest``: importing one gets whichever loaded first.
    Helpers go in a uniquely named module (lac_testkit.py, <role>/<role>_testkit.py)."""
    bad = [f"{p.relative_to(TESTS)}:{line}" for p in _modules() for line, m in _imports(p) if m == "conftest"]
    assert not bad, bad


def test_role_tests_import_only_their_role():
    bad = []
    for role in ROLES:
        allowed = {"common", role, *PEERS[role]}
        for path in sorted((TESTS / role).rglob("*.py")):
            for line, module in _imports(path):
                parts = module.split(".")
                if parts[0] == "lac" and (len(parts) < 2 or parts[1] not in allowed):
                    bad.append(f"{path.relative_to(TESTS)}:{line}: {module}")
    assert not bad, bad


def test_the_curator_is_in_wings():
    """``lac/curator/`` holds its wings and nothing flat beside the package's ``__init__`` (the analyst's client
    is its own distribution, ``lac-analyst``); each wing is a package whose docstring says what it holds."""
    listing = {p.name for p in CURATOR.iterdir() if p.name != "__pycache__"}
    assert listing == {"__init__.py", "py.typed", *CURATOR_WINGS}
    for wing in CURATOR_WINGS:
        init = CURATOR / wing / "__init__.py"
        assert init.is_file(), wing
        assert ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), wing
        assert list((CURATOR / wing).glob("*.py")) != [init], f"{wing} holds no module"


# Module names that say nothing of what a room holds (issue 36): a reader has to open the file to learn it.
VAGUE_NAMES = {"core", "common", "util", "utils", "misc", "helpers", "stuff"}


def test_no_curator_module_has_a_name_that_says_nothing():
    vague = sorted(str(p.relative_to(CURATOR)) for p in CURATOR.rglob("*.py") if p.stem in VAGUE_NAMES)
    assert not vague, vague


def test_test_modules_have_unique_names():
    """The test folders are not packages, so pytest imports each module by its file name: two modules of one
    name in different folders cannot both be collected."""
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, k in names.items() if k > 1] == []
