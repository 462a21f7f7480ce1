"""Sealing report content so only the curator can read it, and opening it again.

A report is sealed with HPKE (RFC 9180, base mode, single shot) to the curator's X25519
public key: KEM X25519-HKDF-SHA256, KDF HKDF-SHA256, AEAD ChaCha20-Poly1305. The HPKE
``info`` binds a context string and the key id, so a payload cannot be re-labelled to
another key or protocol. Before sealing, the serialized ``ReportContent`` is framed
with its length and zero-padded to a power-of-two bucket, so the ciphertext length
says only which bucket a report fell in. The shuffler sees ``encoding``, ``key_id``
and the padded length; it holds no private key and this module's opening side is only
ever given a ``CuratorKeyRing`` by the curator.

Plaintext payloads (``PAYLOAD_ENCODING_PLAINTEXT_INSECURE``) exist for local demos;
the curator refuses them unless it is started with its insecure flag.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import x25519
from cryptography.hazmat.primitives.hpke import AEAD, KDF, KEM, Suite
from google.protobuf.message import DecodeError

from lac.common.errors import InvalidArgument, RejectReason
from lac.common.files import atomic_file, private_dir
from lac.common.v1 import reports_pb2

REPORT_ID_BYTES = 16
HPKE = reports_pb2.PAYLOAD_ENCODING_HPKE_X25519_SHA256_CHACHAPOLY
PLAINTEXT = reports_pb2.PAYLOAD_ENCODING_PLAINTEXT_INSECURE
SUITE = Suite(KEM.X25519, KDF.HKDF_SHA256, AEAD.CHACHA20_POLY1305)
CONTEXT = b"LAC v1 sealed report\x00"
ENC_BYTES = 32  # X25519 encapsulated key
TAG_BYTES = 16  # Poly1305 tag
LENGTH_BYTES = 4
PAD_BUCKETS = tuple(2**k for k in range(9, 17))  # 512 B .. 64 KiB of padded plaintext
SEALED_SIZES = frozenset(ENC_BYTES + b + TAG_BYTES for b in PAD_BUCKETS)
KEY_ID_CHARS = 16


class PayloadRejected(InvalidArgument):
    """A payload that cannot be accepted, and why (the counter label)."""

    def __init__(self, reason: RejectReason, message: str):
        super().__init__(message)
        self.reason = reason


def key_id(public_key: x25519.X25519PublicKey) -> str:
    """16 hex characters of SHA-256 over the raw public key."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:KEY_ID_CHARS]


def _info(kid: str) -> bytes:
    return CONTEXT + kid.encode("ascii")


@dataclass(frozen=True)
class CuratorPublicKey:
    """What a client needs to seal reports: the curator's current public key."""

    key: x25519.X25519PublicKey

    @property
    def key_id(self) -> str:
        return key_id(self.key)

    @classmethod
    def load(cls, path: str | Path) -> CuratorPublicKey:
        data = Path(path).read_bytes()
        try:
            key = serialization.load_pem_public_key(data)
        except ValueError as exc:
            raise InvalidArgument(f"{path}: not a PEM public key ({exc})") from None
        if not isinstance(key, x25519.X25519PublicKey):
            raise InvalidArgument(f"{path}: expected an X25519 public key, got {type(key).__name__}")
        return cls(key)

    def pem(self) -> bytes:
        return self.key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def pad(content: bytes) -> bytes:
    """Length-prefix ``content`` and zero-pad it to the smallest bucket that holds it."""
    framed = len(content).to_bytes(LENGTH_BYTES, "big") + content
    for bucket in PAD_BUCKETS:
        if len(framed) <= bucket:
            return framed + bytes(bucket - len(framed))
    raise InvalidArgument(
        f"report of {len(content)} bytes exceeds the largest padding bucket "
        f"({PAD_BUCKETS[-1] - LENGTH_BYTES} bytes); split the text into several reports"
    )


def unpad(padded: bytes) -> bytes:
    if len(padded) not in PAD_BUCKETS:
        raise PayloadRejected(RejectReason.BAD_PADDING, f"padded plaintext of {len(padded)} bytes is not a bucket size")
    n = int.from_bytes(padded[:LENGTH_BYTES], "big")
    if n > len(padded) - LENGTH_BYTES or any(padded[LENGTH_BYTES + n :]):
        raise PayloadRejected(RejectReason.BAD_PADDING, "padding is malformed")
    return padded[LENGTH_BYTES : LENGTH_BYTES + n]


def seal(content: reports_pb2.ReportContent, public_key: CuratorPublicKey) -> reports_pb2.SealedPayload:
    """HPKE-seal ``content`` to the curator; a fresh ephemeral key per call."""
    kid = public_key.key_id
    data = SUITE.encrypt(pad(content.SerializeToString()), public_key.key, info=_info(kid))
    return reports_pb2.SealedPayload(encoding=HPKE, key_id=kid, data=data)


def seal_insecure(content: reports_pb2.ReportContent) -> reports_pb2.SealedPayload:
    """Plaintext 'sealing' for local demos only: the shuffler can read it."""
    return reports_pb2.SealedPayload(encoding=PLAINTEXT, data=content.SerializeToString())


def check_shape(sealed: reports_pb2.SealedPayload, allow_plaintext: bool, max_bytes: int) -> None:
    """What the shuffler can check without a key: encoding, key id format, padded size."""
    if sealed.encoding == HPKE:
        if len(sealed.key_id) != KEY_ID_CHARS:
            raise PayloadRejected(RejectReason.BAD_KEY_ID, f"key_id must be {KEY_ID_CHARS} hex characters")
        if len(sealed.data) not in SEALED_SIZES:
            raise PayloadRejected(
                RejectReason.BAD_SIZE,
                f"sealed payload of {len(sealed.data)} bytes is not one of the padded sizes {sorted(SEALED_SIZES)}",
            )
    elif sealed.encoding == PLAINTEXT:
        if not allow_plaintext:
            raise PayloadRejected(
                RejectReason.PLAINTEXT_REFUSED,
                "plaintext payloads are refused; seal reports to the curator's key (plaintext is "
                "for --insecure demos only)",
            )
        if not sealed.data:
            raise PayloadRejected(RejectReason.EMPTY, "empty payload")
    else:
        raise PayloadRejected(RejectReason.UNSUPPORTED_ENCODING, f"unsupported payload encoding {sealed.encoding}")
    if len(sealed.data) > max_bytes:
        raise PayloadRejected(RejectReason.OVERSIZED, f"payload of {len(sealed.data)} bytes exceeds {max_bytes}")


class CuratorKeyRing:
    """The curator's private keys: the current one and (after a rotation) the previous one.

    On disk (``lac keys curator``): ``curator-<key id>.key`` (PKCS#8 PEM, mode 0600),
    ``curator-<key id>.pub``, ``curator.pub`` (the current public key, for clients) and
    ``keyring.json`` naming the current and previous key ids.
    """

    def __init__(self, keys: dict[str, x25519.X25519PrivateKey], current: str):
        self._keys = dict(keys)
        self.current = current

    @property
    def key_ids(self) -> list[str]:
        return list(self._keys)

    def public_key(self) -> CuratorPublicKey:
        return CuratorPublicKey(self._keys[self.current].public_key())

    def private_material(self) -> tuple[tuple[str, bytes], ...]:
        """(key id, raw 32-byte private key) of every key, the current one first: how the curator
        hands its ring to its own worker processes (``from_private_material``). Secret."""
        ordered = [self.current] + [k for k in self._keys if k != self.current]
        return tuple(
            (
                kid,
                self._keys[kid].private_bytes(
                    serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
                ),
            )
            for kid in ordered
        )

    @classmethod
    def from_private_material(cls, material: tuple[tuple[str, bytes], ...]) -> CuratorKeyRing:
        """The ring ``private_material`` describes (its first key is the current one)."""
        keys = {}
        for kid, raw in material:
            key = x25519.X25519PrivateKey.from_private_bytes(raw)
            if key_id(key.public_key()) != kid:
                raise ValueError(f"private key material does not hold the X25519 key {kid}")
            keys[kid] = key
        return cls(keys, material[0][0])

    @classmethod
    def load(cls, key_dir: str | Path) -> CuratorKeyRing:
        key_dir = Path(key_dir)
        ring_file = key_dir / "keyring.json"
        if not ring_file.exists():
            raise FileNotFoundError(f"{ring_file} not found; create keys with `lac keys curator --dir {key_dir}`")
        ring = json.loads(ring_file.read_text())
        ids = [ring["current"]] + [k for k in ring.get("previous", []) if k]
        keys = {}
        for kid in ids:
            key = serialization.load_pem_private_key((key_dir / f"curator-{kid}.key").read_bytes(), password=None)
            if not isinstance(key, x25519.X25519PrivateKey) or key_id(key.public_key()) != kid:
                raise ValueError(f"{key_dir}/curator-{kid}.key does not hold the X25519 key {kid}")
            keys[kid] = key
        return cls(keys, ring["current"])

    def open(self, sealed: reports_pb2.SealedPayload) -> bytes:
        key = self._keys.get(sealed.key_id)
        if key is None:
            raise PayloadRejected(
                RejectReason.UNKNOWN_KEY,
                f"sealed to unknown key id {sealed.key_id!r}; this curator holds {', '.join(self._keys)}",
            )
        try:
            padded = SUITE.decrypt(sealed.data, key, info=_info(sealed.key_id))
        except (InvalidTag, ValueError):
            raise PayloadRejected(
                RejectReason.DECRYPT_FAILED, "HPKE open failed: tampered, truncated or sealed to another key"
            ) from None
        return unpad(padded)


def generate_key(key_dir: str | Path, rotate: bool = False) -> str:
    """Create a curator key pair in ``key_dir``; with ``rotate`` the old current key becomes previous.

    Returns the new key id. Keys older than the previous one are removed from the ring
    (their files stay until the operator deletes them).
    """
    key_dir = private_dir(key_dir)
    ring_file = key_dir / "keyring.json"
    if ring_file.exists() and not rotate:
        raise FileExistsError(f"{ring_file} exists; use rotation to replace the current key")
    old = json.loads(ring_file.read_text())["current"] if ring_file.exists() else None
    private = x25519.X25519PrivateKey.generate()
    kid = key_id(private.public_key())
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    key_file = key_dir / f"curator-{kid}.key"
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
        f.flush()
        os.fsync(f.fileno())
    public = CuratorPublicKey(private.public_key()).pem()
    for name in (f"curator-{kid}.pub", "curator.pub"):
        with atomic_file(key_dir / name, mode=0o644) as f:
            f.write(public)
    with atomic_file(ring_file) as f:
        f.write(json.dumps({"current": kid, "previous": [old] if old else []}, indent=1).encode())
    return kid


def open_payload(
    sealed: reports_pb2.SealedPayload, keyring: CuratorKeyRing | None, allow_plaintext: bool = False
) -> reports_pb2.ReportContent:
    """The report content, or ``PayloadRejected`` with a reason label and a message."""
    if sealed.encoding == HPKE:
        if keyring is None:
            raise PayloadRejected(RejectReason.UNKNOWN_KEY, "this curator has no keys loaded")
        data = keyring.open(sealed)
    elif sealed.encoding == PLAINTEXT:
        if not allow_plaintext:
            raise PayloadRejected(
                RejectReason.PLAINTEXT_REFUSED, "plaintext payload refused (curator not in insecure mode)"
            )
        data = sealed.data
    else:
        raise PayloadRejected(RejectReason.UNSUPPORTED_ENCODING, f"unsupported payload encoding {sealed.encoding}")
    content = reports_pb2.ReportContent()
    try:
        content.ParseFromString(data)
    except DecodeError as exc:
        raise PayloadRejected(RejectReason.MALFORMED, f"payload is not a ReportContent: {exc}") from None
    if len(content.report_id) != REPORT_ID_BYTES:
        raise PayloadRejected(
            RejectReason.BAD_REPORT_ID, f"report_id must be {REPORT_ID_BYTES} bytes, got {len(content.report_id)}"
        )
    return content
