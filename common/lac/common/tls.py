"""Transport security: TLS material for the deployment and gRPC credentials from it.

``lac keys tls`` makes a private CA and, per service, a certificate for its host names
(usable as server and as client certificate, so the shuffler's certificate also serves
as its mTLS identity towards the curator). Servers run with TLS unless started with an
explicit insecure flag; clients verify the server against the CA.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import logging
import os
import socket
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from lac.common.files import atomic_file, private_dir

log = logging.getLogger(__name__)

INSECURE_WARNING = (
    "INSECURE MODE: plaintext gRPC without TLS or authentication. Anyone on the network "
    "can read and forge traffic. Use only for local demos and tests."
)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
        f.flush()
        os.fsync(f.fileno())


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    with atomic_file(path, mode=0o644) as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "LAC deployment"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_ca(out_dir: str | Path, days: int = 825) -> None:
    """Create ``ca.pem``/``ca.key`` in ``out_dir`` (refuses to overwrite an existing CA)."""
    out = private_dir(out_dir)
    if (out / "ca.key").exists():
        raise FileExistsError(f"{out / 'ca.key'} exists; remove it to make a new CA")
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("LAC CA"))
        .issuer_name(_name("LAC CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    _write_key(out / "ca.key", key)
    _write_cert(out / "ca.pem", cert)


def issue(out_dir: str | Path, name: str, hosts: list[str], days: int = 397) -> tuple[Path, Path]:
    """Issue ``<name>.pem``/``<name>.key`` signed by the CA in ``out_dir``, valid for ``hosts``.

    The certificate's common name is ``name`` (the mTLS identity) and it allows both
    server and client authentication.
    """
    out = Path(out_dir)
    ca_key = serialization.load_pem_private_key((out / "ca.key").read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):  # make_ca writes a P-256 key
        raise ValueError(f"{out / 'ca.key'} is not an EC private key (make it with `lac keys tls`)")
    ca_cert = x509.load_pem_x509_certificate((out / "ca.pem").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(out / f"{name}.key", key)
    _write_cert(out / f"{name}.pem", cert)
    return out / f"{name}.pem", out / f"{name}.key"


def check_pair(cert: Path, key: Path) -> None:
    """ValueError unless ``cert`` is a PEM certificate and ``key`` its unencrypted private key: said in one line
    here, where gRPC would only say that it failed to bind or to connect."""
    try:
        certificate = x509.load_pem_x509_certificate(cert.read_bytes())
    except ValueError:
        raise ValueError(f"{cert} is not a PEM certificate (`lac keys tls` writes NAME.pem)") from None
    try:
        private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    except (ValueError, TypeError):
        raise ValueError(f"{key} is not an unencrypted PEM private key (`lac keys tls` writes NAME.key)") from None
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if certificate.public_key().public_bytes(*spki) != private.public_key().public_bytes(*spki):
        raise ValueError(
            f"the key {key} does not belong to the certificate {cert} (their public keys differ): "
            "give the .key written with that .pem"
        )


def expires(cert: Path) -> float:
    """When the PEM certificate ``cert`` expires (its notAfter), in Unix time."""
    return x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc.timestamp()


@dataclass(frozen=True)
class ServerTls:
    """A server's certificate and key; with ``client_ca`` client certificates signed by it are
    verified, and required unless ``client_cert_optional``."""

    cert: Path
    key: Path
    client_ca: Path | None = None
    client_cert_optional: bool = False

    def credentials(self) -> grpc.ServerCredentials:
        """gRPC server credentials; client certificates are required when ``client_ca`` is set, unless optional."""
        check_pair(self.cert, self.key)
        ca = self.client_ca.read_bytes() if self.client_ca else None
        return grpc.ssl_server_credentials(
            [(self.key.read_bytes(), self.cert.read_bytes())],
            root_certificates=ca,
            require_client_auth=ca is not None and not self.client_cert_optional,
        )


@dataclass(frozen=True)
class ClientTls:
    """How a client reaches a TLS server: the CA to trust and, for mTLS, its own cert and key."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials trusting ``ca``, presenting the client certificate if one is set."""
        if self.cert and self.key:
            check_pair(self.cert, self.key)
        own = (self.key.read_bytes(), self.cert.read_bytes()) if self.cert and self.key else (None, None)
        return grpc.ssl_channel_credentials(self.ca.read_bytes(), private_key=own[0], certificate_chain=own[1])


def server_tls(
    cert: str,
    key: str,
    client_ca: str = "",
    insecure: bool = False,
    name: str = "server",
    client_cert_optional: bool = False,
) -> ServerTls | None:
    """Validate a server's transport settings: TLS files, or an explicit insecure flag."""
    if insecure:
        if cert or key:
            raise ValueError(f"{name}: both insecure mode and a TLS certificate were given; choose one")
        log.warning("%s: %s", name, INSECURE_WARNING)
        return None
    if bool(cert) != bool(key):
        given, missing = ("--tls-key", "--tls-cert") if key else ("--tls-cert", "--tls-key")
        raise ValueError(
            f"{name}: {given} was given without {missing}: TLS needs this server's certificate and its key "
            "(`lac keys tls` writes NAME.pem and NAME.key)"
        )
    if not (cert and key):
        raise ValueError(
            f"{name}: TLS needs --tls-cert and --tls-key (create them with `lac keys tls`), "
            "or --insecure for a local demo"
        )
    return ServerTls(Path(cert), Path(key), Path(client_ca) if client_ca else None, client_cert_optional)


def client_tls(
    ca: str, cert: str = "", key: str = "", insecure: bool = False, name: str = "client"
) -> ClientTls | None:
    """Validate a client's transport settings: a CA to trust, or an explicit insecure flag."""
    if insecure:
        if ca:
            raise ValueError(f"{name}: both insecure mode and a TLS CA were given; choose one")
        return None
    if not ca:
        raise ValueError(
            f"{name}: TLS needs the CA certificate to trust (`lac keys tls` writes ca.pem), "
            "or the insecure flag for a local demo"
        )
    if bool(cert) != bool(key):
        raise ValueError(f"{name}: a client certificate needs both --cert and --key")
    if cert and key:  # said now, not at the first connection (a shuffler's forwarder would only log it)
        check_pair(Path(cert), Path(key))
    return ClientTls(Path(ca), Path(cert) if cert else None, Path(key) if key else None)


ChannelOptions = Sequence[tuple[str, Any]]


@overload
def channel(
    target: str, tls: ClientTls | None, options: ChannelOptions = (), aio: Literal[False] = False
) -> grpc.Channel: ...
@overload
def channel(
    target: str, tls: ClientTls | None, options: ChannelOptions = (), *, aio: Literal[True]
) -> grpc.aio.Channel: ...


def channel(
    target: str, tls: ClientTls | None, options: ChannelOptions = (), aio: bool = False
) -> grpc.Channel | grpc.aio.Channel:
    """A gRPC channel to ``target`` (an asyncio one with ``aio``): TLS when ``tls`` is given, plaintext otherwise."""
    if aio:
        if tls is None:
            return grpc.aio.insecure_channel(target, options=list(options))
        return grpc.aio.secure_channel(target, tls.credentials(), options=list(options))
    if tls is None:
        return grpc.insecure_channel(target, options=list(options))
    return grpc.secure_channel(target, tls.credentials(), options=list(options))


def client_tls_from_args(args: argparse.Namespace, name: str) -> ClientTls | None:
    """The client TLS settings of a command's ``--ca``, ``--cert``, ``--key`` and ``--insecure``
    (``lac.common.profiles.add_connection_flags``)."""
    return client_tls(args.ca or "", args.cert or "", args.key or "", insecure=args.insecure, name=name)


_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + an empty SETTINGS


def requires_client_cert(address: str, ca: Path, timeout: float = 3.0) -> bool:
    """True if the server at ``address`` completes a TLS handshake (verified against ``ca``) with a client that
    shows no certificate, then closes the connection without answering: it requires one (mutual TLS).
    gRPC reports that only as "Socket closed"."""
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["h2"])
    host = host.strip("[]")
    try:
        with (
            socket.create_connection((host, int(port)), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=host) as conn,
        ):
            conn.sendall(_HTTP2_PREFACE)
            try:
                return conn.recv(1) == b""
            except (ssl.SSLError, ConnectionResetError):
                return True
    except (OSError, ValueError):  # unreachable, not TLS, a certificate that does not verify: some other cause
        return False


def missing_client_cert(args: argparse.Namespace) -> str | None:
    """The real cause of an UNAVAILABLE "Socket closed" for a command given ``--ca`` but no ``--cert``: a
    one-line message if the server requires a client certificate, else None."""
    address = getattr(args, "server", None) or getattr(args, "address", None)
    ca, cert, insecure = (getattr(args, flag, None) for flag in ("ca", "cert", "insecure"))
    if not address or not ca or cert or insecure:
        return None
    if not requires_client_cert(address, Path(args.ca)):
        return None
    return (
        f"{address} requires a client certificate (mutual TLS) and none was given: "
        "pass --cert and --key (a certificate from `lac keys tls` signed by the server's client CA)"
    )
