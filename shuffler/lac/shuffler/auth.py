"""Who is calling the shuffler: bearer tokens with roles (and, on an mTLS port, certificates).

The operator's tokens file holds one ``<sha256 hex of token> <id> [role] [expires=<time>]`` per
line (``#`` comments allowed; the role is ``client`` when omitted, or ``operator``; ``expires`` is
an ISO 8601 UTC time, e.g. ``2027-02-23T12:00:00Z``, after which the token is refused as expired;
without it the token never expires). The tokens themselves are never stored. When a hash appears
on several lines the last one counts: ``rotate_client`` appends the new token and, for each of the
client's current tokens, a line giving it an earlier expiry (the grace period), so the file stays
append-only and files written before expiry existed read as they did. ``add_clients`` appends
lines and returns the new tokens, shown once. The file is re-read when it changes, so clients can
be added, rotated or given an expiry while the shuffler runs. A client id is used only for the
quota per accounting window and to keep two reports of one client out of one batch (through a
keyed hash, see ``ReportLog.client_key``); it never leaves the shuffler.

When the shuffler serves mutual TLS (``tls_client_ca`` set), every caller presents a
certificate and its common name may also carry a role (``client_identities``,
``operator_identities``).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import functools
import hashlib
import logging
import os
import re
import secrets
import time
from pathlib import Path
from typing import NamedTuple

from lac.common.errors import AlreadyExists, InvalidArgument, NotFound, Unauthenticated
from lac.common.rpc import Caller, Role, bearer_token, peer_common_name

log = logging.getLogger(__name__)

_CLIENT_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")
TOKEN_ROLES = {"client": Role.CLIENT, "operator": Role.OPERATOR}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw]?)$")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


class Token(NamedTuple):
    """What the tokens file says of one token: its client's id, its role and when it expires
    (unix seconds; None: never)."""

    client_id: str
    role: Role
    expires: float | None = None

    def expired(self, now: float | None = None) -> bool:
        """Whether the token is past its expiry at ``now`` (default: the current time)."""
        return self.expires is not None and (time.time() if now is None else now) >= self.expires


def token_hash(token: str) -> str:
    """SHA-256 hex digest of a bearer token: the tokens file stores this, never the token.

    A token is 32 random bytes, so one unsalted SHA-256 is enough: there is nothing to guess."""
    return hashlib.sha256(token.encode()).hexdigest()


def parse_duration(text: str) -> float:
    """Seconds in ``text``: a number with an optional unit s, m, h, d or w (``90d``, ``12h``, ``0``)."""
    m = _DURATION.match(text.strip())
    if m is None:
        raise ValueError(f"expected a duration such as 90d, 12h, 30m or 0, got {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def format_time(seconds: float) -> str:
    """``seconds`` (unix time) as the tokens file writes it: ISO 8601 UTC to the second, ``Z``."""
    return dt.datetime.fromtimestamp(int(seconds), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@functools.lru_cache(maxsize=1024)  # a bulk registration writes one expiry on thousands of lines
def _parse_time(text: str) -> float:
    when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if when.tzinfo is None:
        raise ValueError("no time zone")
    return when.timestamp()


def parse_tokens(text: str, source: str = "tokens file") -> dict[str, Token]:
    """{sha256 hex: Token} from the text of a tokens file (the last line of a hash counts). A last line
    without its newline that does not parse is being appended right now: it is left for the next read."""
    out: dict[str, Token] = {}
    lines = text.split("\n")
    for n, line in enumerate(lines, 1):
        try:
            found = _parse_line(line)
        except ValueError:
            if n == len(lines):  # unterminated: a write in progress
                break
            raise ValueError(
                f"{source}:{n}: expected '<sha256 hex> <id> [client|operator] [expires=YYYY-MM-DDTHH:MM:SSZ]'"
            ) from None
        if found is not None:
            out[found[0]] = found[1]
    return out


def _parse_line(line: str) -> tuple[str, Token] | None:
    """(hash, Token) of one line, None for a blank or comment line; ValueError if malformed."""
    parts = line.split("#", 1)[0].split()
    if not parts:
        return None
    if len(parts) < 2 or not re.fullmatch(r"[0-9a-f]{64}", parts[0]):
        raise ValueError
    role, expires = "client", None
    for i, part in enumerate(parts[2:]):
        key, eq, value = part.partition("=")
        if not eq and i == 0 and part in TOKEN_ROLES:
            role = part
        elif key == "expires" and expires is None:
            expires = _parse_time(value)
        else:
            raise ValueError
    return parts[0], Token(parts[1], TOKEN_ROLES[role], expires)


def read_tokens(path: Path) -> dict[str, Token]:
    """{sha256 hex: Token} from a tokens file (missing file = no one)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    return parse_tokens(text, str(path))


def _line(digest: str, client_id: str, role: str, expires: float | None) -> str:
    return f"{digest} {client_id} {role}" + (f" expires={format_time(expires)}" if expires is not None else "") + "\n"


class _Appending:
    """The tokens file opened for appending under an exclusive lock (writers queue; the shuffler only
    reads), with its current contents; ``append`` writes all lines at once and fsyncs."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)

    def __enter__(self) -> _Appending:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # drops the lock

    def tokens(self) -> dict[str, Token]:
        chunks = []
        offset = 0
        while chunk := os.pread(self.fd, 1 << 20, offset):
            chunks.append(chunk)
            offset += len(chunk)
        return parse_tokens(b"".join(chunks).decode(), str(self.path))

    def append(self, lines: list[str]) -> None:
        data = "".join(lines).encode()
        size = os.fstat(self.fd).st_size
        if size and os.pread(self.fd, 1, size - 1) != b"\n":  # a hand-edited last line, or a writer that died
            data = b"\n" + data
        while data:
            data = data[os.write(self.fd, data) :]
        os.fsync(self.fd)


def _check_ids(ids: list[str], role: str) -> None:
    if role not in TOKEN_ROLES:
        raise InvalidArgument(f"role must be one of {', '.join(TOKEN_ROLES)}")
    for client_id in ids:
        if not _CLIENT_ID.match(client_id):
            raise InvalidArgument(f"id {client_id[:40]!r}: 1-128 characters of A-Z a-z 0-9 . _ : @ -")


def add_clients(
    path: Path, ids: list[str], role: str = "client", expires: float | None = None, new_ids_only: bool = False
) -> list[str]:
    """Register ``ids`` with ``role`` in the tokens file (one locked append, one fsync); return their new
    tokens. ``expires`` (unix seconds) makes the tokens expire then. ``new_ids_only``: refuse (AlreadyExists)
    ids that are repeated or already have a token, so a bulk registration never gives one client two tokens."""
    _check_ids(ids, role)
    tokens = [secrets.token_urlsafe(32) for _ in ids]
    with _Appending(path) as f:
        if new_ids_only:
            seen = {t.client_id for t in f.tokens().values()}
            repeated = []
            for c in ids:
                if c in seen:
                    repeated.append(c)
                seen.add(c)
            if repeated:
                raise AlreadyExists(
                    f"{len(repeated)} id(s) already registered or repeated, e.g. {repeated[0][:40]!r}: "
                    f"`lac shuffler rotate-client` replaces a client's token"
                )
        f.append([_line(token_hash(t), c, role, expires) for t, c in zip(tokens, ids)])
    return tokens


def add_client(path: Path, client_id: str, role: str = "client", expires: float | None = None) -> str:
    """Register ``client_id``; return its new bearer token (not stored)."""
    return add_clients(path, [client_id], role, expires)[0]


def next_ids(path: Path, prefix: str, count: int) -> list[str]:
    """``count`` ids ``<prefix><n>`` numbered on from the largest such id in the tokens file (from 1)."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)")
    last = max(
        (int(m.group(1)) for t in read_tokens(path).values() if (m := pattern.fullmatch(t.client_id))), default=0
    )
    return [f"{prefix}{n}" for n in range(last + 1, last + 1 + count)]


class Rotation(NamedTuple):
    """What ``rotate_client`` did: the new token, its role and expiry, and until when the old ones work."""

    token: str
    role: str
    expires: float | None
    old_tokens: int
    old_until: float


def rotate_client(
    path: Path,
    client_id: str,
    grace_seconds: float,
    expires: float | None = None,
    role: str | None = None,
    now: float | None = None,
) -> Rotation:
    """Issue ``client_id`` a new token (expiring at ``expires``, or never) and let its current tokens work for
    ``grace_seconds`` more (those expiring sooner keep their expiry). ``role`` picks which of the client's
    roles to rotate when it has tokens of both. NotFound if the client has no current token."""
    _check_ids([client_id], role or "client")
    now = time.time() if now is None else now
    with _Appending(path) as f:
        current = {h: t for h, t in f.tokens().items() if t.client_id == client_id and not t.expired(now)}
        roles = sorted({t.role.value for t in current.values()})
        if not current:
            raise NotFound(f"{client_id[:40]!r} has no current token in {path} (`lac shuffler add-client` adds one)")
        if role is None and len(roles) > 1:
            raise InvalidArgument(f"{client_id[:40]!r} has {' and '.join(roles)} tokens: say which with --role")
        role = role or roles[0]
        old = {h: t for h, t in current.items() if t.role.value == role}
        if not old:
            raise NotFound(f"{client_id[:40]!r} has no current {role} token in {path}")
        until = now + grace_seconds
        token = secrets.token_urlsafe(32)
        lines = [
            _line(h, client_id, role, min(t.expires, until) if t.expires is not None else until) for h, t in old.items()
        ]
        lines.append(_line(token_hash(token), client_id, role, expires))
        f.append(lines)
    return Rotation(token, role, expires, len(old), until)


class ShufflerAuth:
    """``lac.common.rpc.Authenticator`` of the shuffler.

    * a bearer token from the tokens file: its role (client or operator), identity ``token:<id>``;
    * on an mTLS port, a certificate whose common name is in ``operator_identities`` /
      ``client_identities``: that role, identity ``mtls:<name>`` (a token's identity wins);
    * ``client_auth=False`` (auth none): every caller is also an anonymous client (no quota, no
      distinct-client guarantee: local demos only);
    * ``insecure`` (plaintext transport): every caller also has the operator role (local demos
      and tests only); clients still need their tokens.
    Unknown, malformed or expired tokens are UNAUTHENTICATED (an expired one says so, with its expiry);
    ``lac.common.rpc`` answers a caller without
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
        self._tokens: dict[str, Token] = {}
        self._stamp: tuple[int, int, int] | None = None
        self._reload()
        if (
            client_auth
            and not any(t.role is Role.CLIENT and not t.expired() for t in self._tokens.values())
            and not clients
        ):
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
            if found.expired():  # the message names the time, never the client: it is logged
                assert found.expires is not None
                raise Unauthenticated(
                    f"bearer token expired at {format_time(found.expires)}: ask the shuffler's operator for a "
                    f"new one (`lac shuffler rotate-client`)"
                )
            identity = "token:" + found.client_id
            roles.add(found.role)
        if not self.client_auth and Role.CLIENT not in roles:
            roles.add(Role.CLIENT)  # an anonymous client: no quota (INSECURE demo mode)
            if Role.OPERATOR not in roles:
                identity = None
        return Caller(identity, frozenset(roles))
