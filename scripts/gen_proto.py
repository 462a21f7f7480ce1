#!/usr/bin/env python3
"""Generate lac.common.v1 (messages, gRPC stubs, .pyi) from proto/lac/v1/*.proto.

The protos live at proto/lac/v1 (package lac.v1); the Python code is installed as
lac.common.v1, so imports in the generated files are rewritten accordingly.
Usage: gen_proto.py [--out DIR]   (default: common/lac/common/v1)
       gen_proto.py --check       (exit 1 if the checked-in code differs)
"""

from __future__ import annotations

import argparse
import filecmp
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
DEFAULT_OUT = ROOT / "common" / "lac" / "common" / "v1"
_IMPORT = re.compile(r"^(from|import) lac\.v1\b", re.MULTILINE)


def generate(out: Path) -> list[Path]:
    import grpc_tools
    from grpc_tools import protoc  # dev dependency (pinned with grpcio)

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "lac" / "v1").glob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        wkt = Path(grpc_tools.__file__).parent / "_proto"
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{wkt}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *protos,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for src in sorted((Path(tmp) / "lac" / "v1").iterdir()):
            text = _IMPORT.sub(lambda m: f"{m.group(1)} lac.common.v1", src.read_text())
            dst = out / src.name
            dst.write_text(text)
            written.append(dst)
        (out / "__init__.py").write_text('"""Generated from proto/lac/v1 by scripts/gen_proto.py; do not edit."""\n')
        written.append(out / "__init__.py")
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true", help="compare a fresh generation with the checked-in code")
    a = ap.parse_args()
    if not a.check:
        for p in generate(a.out):
            print(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name for p in generate(Path(tmp))}
        have = {p.name for p in DEFAULT_OUT.iterdir() if p.is_file()}
        bad = sorted(fresh ^ have) + sorted(
            n for n in fresh & have if not filecmp.cmp(Path(tmp) / n, DEFAULT_OUT / n, shallow=False)
        )
    if bad:
        print("generated code is stale; run scripts/gen_proto.py:", ", ".join(bad), file=sys.stderr)
        return 1
    print("generated code is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
