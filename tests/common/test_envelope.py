"""Sealed reports: HPKE round trips, a known answer, and clean rejection of every bad payload."""

import json
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import x25519

from lac.common import envelope
from lac.common.envelope import PayloadRejected
from lac.common.v1 import reports_pb2

KAT = json.loads((Path(__file__).parent / "data" / "hpke_kat.json").read_text())


def content(text="the cat sat on the mat", n=1):
    return reports_pb2.ReportContent(
        report_id=os.urandom(16), sentences=[reports_pb2.Sentence(tokens=text.split())] * n
    )


@pytest.fixture()
def ring(tmp_path):
    envelope.generate_key(tmp_path)
    return envelope.CuratorKeyRing.load(tmp_path)


def test_round_trip_and_fresh_ciphertexts(ring, tmp_path):
    pub = envelope.CuratorPublicKey.load(tmp_path / "curator.pub")
    assert pub.key_id == ring.current
    c = content()
    a, b = envelope.seal(c, pub), envelope.seal(c, pub)
    assert a.data != b.data, "each seal must use a fresh ephemeral key"
    assert a.encoding == envelope.HPKE and a.key_id == ring.current
    assert envelope.open_payload(a, ring) == c and envelope.open_payload(b, ring) == c
    assert b"cat" not in a.data


def test_known_answer():
    key = x25519.X25519PrivateKey.from_private_bytes(bytes.fromhex(KAT["private_key_hex"]))
    ring = envelope.CuratorKeyRing({KAT["key_id"]: key}, KAT["key_id"])
    sealed = reports_pb2.SealedPayload(
        encoding=envelope.HPKE, key_id=KAT["key_id"], data=bytes.fromhex(KAT["sealed_hex"])
    )
    opened = envelope.open_payload(sealed, ring)
    assert opened.report_id.hex() == KAT["report_id_hex"]
    assert list(opened.sentences[0].tokens) == KAT["tokens"]
    assert envelope.key_id(key.public_key()) == KAT["key_id"]


def test_padding_hides_length_within_a_bucket(ring):
    pub = ring.public_key()
    sizes = {len(envelope.seal(content("a " * k), pub).data) for k in range(1, 100)}
    assert sizes <= envelope.SEALED_SIZES and len(sizes) == 1


def test_oversized_report_refused_before_sealing(ring):
    with pytest.raises(envelope.InvalidArgument, match="largest padding bucket"):
        envelope.seal(content("word " * 20000), ring.public_key())


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda s: s.__setattr__("data", s.data[:-1] + bytes([s.data[-1] ^ 1])), "decrypt_failed"),
        (lambda s: s.__setattr__("data", s.data[:40] + bytes([s.data[40] ^ 1]) + s.data[41:]), "decrypt_failed"),
        (lambda s: s.__setattr__("data", s.data[:100]), "decrypt_failed"),
        (lambda s: s.__setattr__("data", b""), "decrypt_failed"),
        (lambda s: s.__setattr__("key_id", "0123456789abcdef"), "unknown_key"),
        (lambda s: s.__setattr__("encoding", 77), "unsupported_encoding"),
        (lambda s: s.__setattr__("encoding", envelope.PLAINTEXT), "plaintext_refused"),
    ],
)
def test_bad_payloads_rejected_with_reason(ring, mutate, reason):
    sealed = envelope.seal(content(), ring.public_key())
    mutate(sealed)
    with pytest.raises(PayloadRejected) as exc:
        envelope.open_payload(sealed, ring)
    assert exc.value.reason == reason


def test_wrong_key_and_relabelled_key_id(tmp_path):
    envelope.generate_key(tmp_path / "a")
    envelope.generate_key(tmp_path / "b")
    a, b = (envelope.CuratorKeyRing.load(tmp_path / d) for d in "ab")
    sealed = envelope.seal(content(), a.public_key())
    with pytest.raises(PayloadRejected, match="unknown key") as exc:
        envelope.open_payload(sealed, b)
    assert exc.value.reason == "unknown_key"
    sealed.key_id = b.current  # claim it was sealed to b's key: the info binding and the key both disagree
    with pytest.raises(PayloadRejected) as exc:
        envelope.open_payload(sealed, b)
    assert exc.value.reason == "decrypt_failed"


def test_rotation_accepts_current_and_previous_only(tmp_path):
    envelope.generate_key(tmp_path)
    first = envelope.CuratorKeyRing.load(tmp_path).public_key()
    envelope.generate_key(tmp_path, rotate=True)
    second = envelope.CuratorKeyRing.load(tmp_path).public_key()
    envelope.generate_key(tmp_path, rotate=True)
    ring = envelope.CuratorKeyRing.load(tmp_path)
    assert envelope.open_payload(envelope.seal(content(), second), ring)
    assert envelope.open_payload(envelope.seal(content(), ring.public_key()), ring)
    with pytest.raises(PayloadRejected) as exc:
        envelope.open_payload(envelope.seal(content(), first), ring)
    assert exc.value.reason == "unknown_key"
    with pytest.raises(FileExistsError):
        envelope.generate_key(tmp_path)
    assert oct((tmp_path / f"curator-{ring.current}.key").stat().st_mode & 0o777) == "0o600"


def test_malformed_plaintext_inside_valid_ciphertext(ring):
    kid = ring.current
    data = envelope.SUITE.encrypt(envelope.pad(b"\xff\xff\xff"), ring.public_key().key, info=envelope._info(kid))
    with pytest.raises(PayloadRejected) as exc:
        envelope.open_payload(reports_pb2.SealedPayload(encoding=envelope.HPKE, key_id=kid, data=data), ring)
    assert exc.value.reason == "malformed"
    short_id = reports_pb2.ReportContent(report_id=b"x")
    with pytest.raises(PayloadRejected) as exc:
        envelope.open_payload(envelope.seal(short_id, ring.public_key()), ring)
    assert exc.value.reason == "bad_report_id"
    bad_pad = envelope.SUITE.encrypt(
        b"\x00\x00\x00\x01a" + b"\x01" * 507, ring.public_key().key, info=envelope._info(kid)
    )
    with pytest.raises(PayloadRejected) as exc:
        envelope.open_payload(reports_pb2.SealedPayload(encoding=envelope.HPKE, key_id=kid, data=bad_pad), ring)
    assert exc.value.reason == "bad_padding"


def test_shape_check_is_what_the_shuffler_can_see(ring):
    sealed = envelope.seal(content(), ring.public_key())
    envelope.check_shape(sealed, allow_plaintext=False, max_bytes=1 << 20)
    for data, reason in ((sealed.data[:-1], "bad_size"), (sealed.data + b"\0", "bad_size")):
        with pytest.raises(PayloadRejected) as exc:
            envelope.check_shape(
                reports_pb2.SealedPayload(encoding=envelope.HPKE, key_id=ring.current, data=data),
                allow_plaintext=False,
                max_bytes=1 << 20,
            )
        assert exc.value.reason == reason
    with pytest.raises(PayloadRejected) as exc:
        envelope.check_shape(sealed, allow_plaintext=False, max_bytes=100)
    assert exc.value.reason == "oversized"
    with pytest.raises(PayloadRejected) as exc:
        envelope.check_shape(envelope.seal_insecure(content()), allow_plaintext=False, max_bytes=1 << 20)
    assert exc.value.reason == "plaintext_refused"
    envelope.check_shape(envelope.seal_insecure(content()), allow_plaintext=True, max_bytes=1 << 20)
