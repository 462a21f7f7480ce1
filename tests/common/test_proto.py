"""The checked-in generated code is exactly what scripts/gen_proto.py produces."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_matches_protos():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr + result.stdout


def test_package_is_versioned():
    from lac.common.v1 import curator_pb2, shuffler_pb2

    assert shuffler_pb2.DESCRIPTOR.package == "lac.v1"
    assert curator_pb2.DESCRIPTOR.services_by_name["CuratorIngest"].full_name == "lac.v1.CuratorIngest"
