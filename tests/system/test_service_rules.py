"""Both services hold the rules of a service's shape (``service_rules``; issue 36, docs/design.md "Shape of the
code"), and each rule fails on a package that breaks it."""

from __future__ import annotations

from pathlib import Path

import pytest
from service_rules import foreign_underscore_reads, long_servicer_methods, oversized, proto_importers

ROOT = Path(__file__).resolve().parents[2]
# Each service's package and its servicer, serde, state, lifecycle and handler rooms (docs/design.md, "Layout").
SERVICES = {
    "shuffler": (
        ROOT / "shuffler" / "lac" / "shuffler",
        ("server", "serde", "state", "lifecycle", "intake", "releases", "forward", "shards", "status"),
    ),
    "curator": (
        ROOT / "curator" / "lac" / "curator" / "service",
        ("server", "serde", "state", "lifecycle", "handlers"),
    ),
}


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_only_the_edges_of_a_service_import_the_generated_messages(service):
    assert proto_importers(SERVICES[service][0]) == []


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_servicer_methods_are_at_most_six_statements(service):
    package = SERVICES[service][0]
    assert long_servicer_methods(package) == []
    assert long_servicer_methods(package, limit=1)  # the check sees the servicers' methods


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_service_rooms_are_small(service):
    package, rooms = SERVICES[service]
    assert all((package / r).is_dir() or (package / f"{r}.py").exists() for r in rooms)
    assert oversized(package, rooms) == []
    assert oversized(package, rooms, class_lines=50, module_lines=100)  # the check sees them


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_no_service_module_reads_another_objects_underscore_attribute(service):
    assert foreign_underscore_reads(SERVICES[service][0]) == []


def test_no_curator_module_reads_another_objects_underscore_attribute():
    """Below the service wing too: every wing of the curator asks the owner through a public name."""
    assert foreign_underscore_reads(ROOT / "curator" / "lac" / "curator") == []


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_no_service_module_is_left(service):
    """Issue 36: the one class that held every concern is gone (``lifecycle``, ``state`` and the handlers)."""
    assert not (SERVICES[service][0] / "service.py").exists()


BROKEN = """
from lac.common.v1 import shuffler_pb2


class Handle:
    def one(self, other):
        return other._secret + self._mine + type(other).__name__ + other._asdict()


class WideServicer:
    async def Submit(self, request, context, caller):
        \"\"\"Not a statement.\"\"\"
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
    (pkg / "handlers").mkdir(parents=True)
    (pkg / "handlers" / "intake.py").write_text(BROKEN + "\n" * 450, encoding="utf-8")
    (pkg / "serde.py").write_text("from lac.common.v1 import reports_pb2\n", encoding="utf-8")
    (pkg / "state.py").write_text("import lac.common.v1.curator_pb2\n", encoding="utf-8")
    assert proto_importers(pkg) == ["handlers.intake:2", "state:1"]  # serde may
    assert long_servicer_methods(pkg) == ["WideServicer.Submit (9 statements)"]
    assert oversized(pkg, ["handlers", "serde"]) == ["module handlers.intake (472 lines)"]
    assert oversized(pkg, ["handlers"], class_lines=5) == [
        "module handlers.intake (472 lines)",
        "class handlers.intake.WideServicer (13 lines)",
    ]
    assert foreign_underscore_reads(pkg) == ["handlers.intake:7 other._secret"]
