"""Who is calling the shuffler: bearer tokens with roles (and, on an mTLS port, certificates).

The operator's tokens file holds one ``<sha256 hex of token> <id> [role]`` per line (``#``
comments allowed; the role is ``client`` when omitted, or ``operator``); the tokens themselves
are never stored. ``add_clients`` appends lines and returns the new tokens, shown once. The file
is re-read when it changes, so clients can be added while the shuffler runs. A client id is used
only for the quota per accounting window and to keep two reports of one client out of one
batch (through a keyed hash, see ``ReportLog.client_key``); it never leaves the shuffler.

When the shuffler serves mutual TLS (``tls_client_ca`` set), every caller presents a
certificate and its common name may also carry a role (``client_identities``,
``operator_identities``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
from pathlib import Path

from lac.common.errors import InvalidArgument, Unauthenticated
from lac.common.rpc import Caller, Role, bearer_token, peer_common_name

log = logging.getLogger(__name__)

_CLIENT_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")
TOKEN_ROLES = {"client": Role.CLIENT, "operator": Role.OPERATOR}


def token_hash(token: str) -> str:
    """SHA-256 hex digest of a bearer token: the tokens file stores this, never the token."""
    return hashlib.sha256(token.encode()).hexdigest()


def read_tokens(path: Path) -> dict[str, tuple[str, Role]]:
    """{sha256 hex: (id, role)} from a tokens file (missing file = no one)."""
    out: dict[str, tuple[str, Role]] = {}
    try:
        text = path.read_text()
    except FileNotFoundError:
        return out
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if (
            len(parts) not in (2, 3)
            or not re.fullmatch(r"[0-9a-f]{64}", parts[0])
            or (len(parts) == 3 and parts[2] not in TOKEN_ROLES)
        ):
            raise ValueError(f"{path}:{n}: expected '<sha256 hex> <id> [client|operator]'")
        out[parts[0]] = (parts[1], TOKEN_ROLES[parts[2] if len(parts) == 3 else "client"])
    return out


def add_clients(path: Path, ids: list[str], role: str = "client") -> list[str]:
    """Register ``ids`` with ``role`` in the tokens file (one append, one fsync); return their new tokens."""
    if role not in TOKEN_ROLES:
        raise InvalidArgument(f"role must be one of {', '.join(TOKEN_ROLES)}")
    for client_id in ids:
        if not _CLIENT_ID.match(client_id):
            raise InvalidArgument(f"id {client_id[:40]!r}: 1-128 characters of A-Z a-z 0-9 . _ : @ -")
    tokens = [secrets.token_urlsafe(32) for _ in ids]
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write("".join(f"{token_hash(t)} {c} {role}\n" for t, c in zip(tokens, ids)))
        f.flush()
        os.fsync(f.fileno())
    return tokens


def add_client(path: Path, client_id: str, role: str = "client") -> str:
    """Register ``client_id``; return its new bearer token (not stored)."""
    return add_clients(path, [client_id], role)[0]


class ShufflerAuth:
    """``lac.common.rpc.Authenticator`` of the shuffler.

    * a bearer token from the tokens file: its role (client or operator), identity ``token:<id>``;
    * on an mTLS port, a certificate whose common name is in ``operator_identities`` /
      ``client_identities``: that role, identity ``mtls:<name>`` (a token's identity wins);
    * ``client_auth=False`` (auth none): every caller is also an anonymous client (no quota, no
      distinct-client guarantee: local demos only);
    * ``insecure`` (plaintext transport): every caller also has the operator role (local demos
      and tests only); clients still need their tokens.
    Unknown or malformed tokens are UNAUTHENTICATED; ``lac.common.rpc`` answers a caller without
    the needed role UNAUTHENTICATED when anonymous, PERMISSION_DENIED otherwise.
    """

    hint = "send metadata 'authorization: Bearer <token>' (`lac shuffler add-client` makes one)"

    def __init__(
        self,
        tokens_file: Path | None,
        operators: frozenset[str] = frozenset(),
        clients: frozenset[str] = frozenset(),
        client_auth: bool = True,
        insecure: bool = False,
    ):
        self.tokens_file = tokens_file
        self.operators, self.clients = operators, clients
        self.client_auth, self.insecure = client_auth, insecure
        self._tokens: dict[str, tuple[str, Role]] = {}
        self._stamp: tuple[int, int, int] | None = None
        self._reload()
        if client_auth and not any(role is Role.CLIENT for _, role in self._tokens.values()) and not clients:
            log.warning(
                "no client registered in %s: every Submit is UNAUTHENTICATED until clients are "
                "added with `lac shuffler add-client`",
                tokens_file,
            )

    @property
    def enabled(self) -> bool:
        """Whether clients must authenticate (False with ``auth none``: every caller is an anonymous client)."""
        return self.client_auth

    def _reload(self) -> None:
        stamp = None
        if self.tokens_file is not None:
            try:
                st = os.stat(self.tokens_file)
                stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            except FileNotFoundError:
                pass
        if stamp != self._stamp:
            self._tokens = read_tokens(self.tokens_file) if stamp and self.tokens_file is not None else {}
            self._stamp = stamp

    def identify(self, context) -> Caller:
        """The caller of an RPC from its mTLS certificate and bearer token (Unauthenticated for an unknown token)."""
        roles: set[Role] = set()
        identity = None
        if self.insecure:
            roles.add(Role.OPERATOR)
        name = peer_common_name(context)
        if name is not None:
            identity = "mtls:" + name
            if name in self.operators:
                roles.add(Role.OPERATOR)
            if name in self.clients:
                roles.add(Role.CLIENT)
        token = bearer_token(context)
        if token is not None:
            self._reload()
            found = self._tokens.get(token_hash(token))
            if found is None:
                raise Unauthenticated("unknown bearer token")
            identity = "token:" + found[0]
            roles.add(found[1])
        if not self.client_auth and Role.CLIENT not in roles:
            roles.add(Role.CLIENT)  # an anonymous client: no quota (INSECURE demo mode)
            if Role.OPERATOR not in roles:
                identity = None
        return Caller(identity, frozenset(roles))
