"""Name traces of the curator's two requests-turned-values (issue 36): which curator modules name a type in code (an
import of it, ``x.Name``, or the bare name; prose and strings are not counted), by wing.

- ``Release``, the central mechanisms' result type (``lac.curator.release.building``): defined in ``release``, made
  by ``mechanisms`` and read by ``runner`` (which turns it into the ``ReleaseRecord`` the ledger keeps); the service
  never names it: its handlers get it from the runner as a value and return the record, which only the serde turns
  into a reply.
- ``IngestBatch``, a batch from the shuffler as ingest sees it (``lac.curator.ingest.chunks``): built by the
  service's serde from the wire, handed by the servicer to the ingest handler, whose pool opens its payloads in the
  ``ingest`` wing; no wing between them (store, engines, release, ...) names it.

A module of any other wing naming one (a wing below its home importing it upward, or one outside the trace) breaks
the trace."""

from __future__ import annotations

import ast
from pathlib import Path

from test_imports import CURATOR_WING_ORDER

ROOT = Path(__file__).resolve().parents[2]
CURATOR = ROOT / "curator" / "lac" / "curator"
RESULT = "Release"
HOME = "release"  # the wing that defines it
TRACE = ("release", "mechanisms", "runner")  # the wings that may name it: its home, its makers, its reader
# IngestBatch: its home (ingest) and the service, whose serde builds it and whose ingest handler consumes it
INGEST_TRACE = ("ingest", "service")


def namers(package: Path, name: str) -> dict[str, list[str]]:
    """``wing -> ["module:line", ...]`` of the modules of ``package`` that name (or define) ``name`` in code."""
    out: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if "__pycache__" in rel.parts or len(rel.parts) < 2:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            hit = (
                (isinstance(node, ast.ClassDef) and node.name == name)
                or (isinstance(node, ast.Name) and node.id == name)
                or (isinstance(node, ast.Attribute) and node.attr == name)
                or (isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names))
            )
            if hit:
                module = ".".join(rel.with_suffix("").parts)
                out.setdefault(rel.parts[0], []).append(f"{module}:{node.lineno}")
                break
    return out


def off_trace(package: Path, name: str = RESULT, trace: tuple[str, ...] = TRACE, home_wing: str = HOME) -> list[str]:
    """The modules that name ``name`` outside the wings of ``trace``, with the wing's place relative to its home."""
    home = CURATOR_WING_ORDER.index(home_wing)
    out = []
    for wing, where in namers(package, name).items():
        if wing in trace:
            continue
        up = wing in CURATOR_WING_ORDER and CURATOR_WING_ORDER.index(wing) < home
        out += [f"{w} ({'imports it upward' if up else 'outside the trace'})" for w in where]
    return out


def test_the_release_goes_only_down_from_the_mechanisms_and_back_as_the_reply():
    assert set(TRACE) <= set(CURATOR_WING_ORDER)
    assert off_trace(CURATOR) == []
    assert set(namers(CURATOR, RESULT)) == set(TRACE)  # not vacuous: defined, made and read where said


def test_an_ingest_batch_goes_from_the_serde_down_to_ingest_and_nowhere_else():
    assert off_trace(CURATOR, "IngestBatch", INGEST_TRACE, "ingest") == []
    assert set(namers(CURATOR, "IngestBatch")) == set(INGEST_TRACE)


def test_the_trace_flags_a_module_that_takes_the_result_type_upward_or_into_the_service(tmp_path):
    pkg = tmp_path / "pkg"
    for wing in ("store", "release", "mechanisms", "runner", "service"):
        (pkg / wing).mkdir(parents=True)
        (pkg / wing / "__init__.py").write_text("")
    (pkg / "release" / "building.py").write_text("class Release:\n    pass\n")
    (pkg / "mechanisms" / "toy.py").write_text("from pkg.release import building\n\nR = building.Release\n")
    (pkg / "runner" / "run.py").write_text('"""Returns a ``Release``."""\nfrom pkg.release.building import Release\n')
    (pkg / "service" / "serde.py").write_text('NAME = "Release"  # a string, not the type\n')
    assert off_trace(pkg) == []
    (pkg / "store" / "segments.py").write_text("from pkg.release.building import Release  # upward\n")
    (pkg / "service" / "reply.py").write_text("def reply(r):\n    return r.Release  # a reply built from it\n")
    assert off_trace(pkg) == ["service.reply:2 (outside the trace)", "store.segments:1 (imports it upward)"]


def test_the_ingest_trace_flags_a_wing_below_ingest_that_names_the_batch(tmp_path):
    pkg = tmp_path / "pkg"
    for wing in ("store", "ingest", "service"):
        (pkg / wing).mkdir(parents=True)
        (pkg / wing / "__init__.py").write_text("")
    (pkg / "ingest" / "chunks.py").write_text("class IngestBatch:\n    pass\n")
    (pkg / "service" / "serde.py").write_text("from pkg.ingest.chunks import IngestBatch\n")
    assert off_trace(pkg, "IngestBatch", INGEST_TRACE, "ingest") == []
    (pkg / "store" / "store.py").write_text("def add(batch: IngestBatch): ...\n")
    assert off_trace(pkg, "IngestBatch", INGEST_TRACE, "ingest") == ["store.store:1 (imports it upward)"]
