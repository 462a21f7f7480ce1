"""Every reason a report is refused, quarantined or dropped for is a ``RejectReason`` member, and the
members' values (stored in the shuffler's counters and the curator's quarantine rows, shown in
metrics and status) stay what they are."""

import ast
from pathlib import Path

from lac.common import envelope
from lac.common.errors import RejectReason
from lac.common.v1 import reports_pb2
from lac.curator.ingest.chunks import IngestContext, open_chunk

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [ROOT / "common" / "lac", ROOT / "shuffler" / "lac", ROOT / "curator" / "lac"]
REASON_CALLS = {"count_reject", "Quarantined", "PayloadRejected", "_Reject"}  # first argument: a reason

STORED = {
    "malformed",
    "empty",
    "oversized",
    "bad_size",
    "bad_key_id",
    "bad_padding",
    "bad_report_id",
    "unsupported_encoding",
    "plaintext_refused",
    "unknown_key",
    "decrypt_failed",
    "invalid_argument",
    "unspecified_encoding",
    "quota",
    "period_cap",
    "log_full",
    "overloaded",
    "storage_unavailable",
    "wrong_shard",
    "shards_not_effective",
    "shard_list_mismatch",
    "deployment_mismatch",
    "invalid",
    "mechanism_not_allowed",
    "epsilon_too_large",
    "epsilon_not_exact",
    "embedding_mismatch",
    "too_many_words",
    "internal",
    "replayed_report_id",
}


def test_values_are_the_stored_labels():
    assert {r.value for r in RejectReason} == STORED
    assert all(r.value.isascii() and r.value.islower() and " " not in r.value for r in RejectReason)


def _calls():
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                yield path.relative_to(ROOT), node


def test_no_reason_is_a_string_literal():
    checked = 0
    for where, node in _calls():
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name in REASON_CALLS:
                checked += 1
                arg = node.args[0]
                assert not isinstance(arg, ast.Constant), f"{where}:{node.lineno}: {name}({arg.value!r})"
                if isinstance(arg, ast.Attribute) and getattr(arg.value, "id", None) == "RejectReason":
                    assert arg.attr in RejectReason.__members__, f"{where}:{node.lineno}"
        # A counter named by hand ("reject:quota") would bypass the enum.
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("reject:"):
            assert node.value == "reject:", f"{where}:{node.lineno}: {node.value!r}: use 'reject:' + RejectReason"
    assert checked >= 30  # the scan found the call sites


def _content(mechanism=1, epsilon=1.0, embedding="e", report_id=b"r" * 16, words=("a",)):
    return reports_pb2.ReportContent(
        report_id=report_id,
        sentences=[reports_pb2.Sentence(tokens=list(words))],
        local_privacy=reports_pb2.LocalPrivacy(mechanism=mechanism, epsilon_per_word=epsilon, embedding=embedding),
    )


def test_quarantine_reasons_are_members():
    ctx = IngestContext(
        keys=(),
        allow_plaintext=True,
        mechanism="multivariate-laplace",
        epsilon_per_word=1.0,
        embedding="e",
        max_report_words=3,
        max_sentences_per_report=4,
        max_token_chars=10,
        max_n=2,
        exact_epsilon=True,
    )
    hpke = reports_pb2.SealedPayload(encoding=envelope.HPKE, key_id="0" * 16, data=b"x" * 600)
    cases = {
        b"\xff": RejectReason.MALFORMED,
        hpke.SerializeToString(): RejectReason.UNKNOWN_KEY,
        envelope.seal_insecure(_content(report_id=b"short")).SerializeToString(): RejectReason.BAD_REPORT_ID,
        envelope.seal_insecure(_content(mechanism=2)).SerializeToString(): RejectReason.MECHANISM_NOT_ALLOWED,
        envelope.seal_insecure(_content(epsilon=2.0)).SerializeToString(): RejectReason.EPSILON_TOO_LARGE,
        envelope.seal_insecure(_content(epsilon=0.5)).SerializeToString(): RejectReason.EPSILON_NOT_EXACT,
        envelope.seal_insecure(_content(embedding="f")).SerializeToString(): RejectReason.EMBEDDING_MISMATCH,
        envelope.seal_insecure(_content(words=("a b",))).SerializeToString(): RejectReason.INVALID,
        envelope.seal_insecure(_content(words=("a",) * 4)).SerializeToString(): RejectReason.TOO_MANY_WORDS,
    }
    opened = open_chunk(ctx, [*cases, envelope.seal_insecure(_content()).SerializeToString()])
    assert len(opened.ids) == 1
    assert [q.reason for q in opened.quarantined] == list(cases.values())
    assert all(type(q.reason) is RejectReason for q in opened.quarantined)
