"""Client authentication at the shuffler: bearer tokens (and mTLS peer identity).

The operator's tokens file holds one ``<sha256 hex of token> <client id>`` per line
(``#`` comments allowed); the tokens themselves are never stored. ``add_client`` appends a
line and returns the new token, shown once. The file is re-read when it changes, so clients
can be added while the shuffler runs. The client id is used only for the per-epoch quota
(through a keyed hash, see ``ReportLog.client_key``) and never leaves the shuffler.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
from pathlib import Path

from lac.common.errors import InvalidArgument, Unauthenticated
from lac.common.tls import peer_identity

log = logging.getLogger(__name__)

_CLIENT_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")



def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def read_tokens(path: Path) -> dict[str, str]:
    """{sha256 hex: client id} from a tokens file (missing file = no clients)."""
    out = {}
    try:
        text = path.read_text()
    except FileNotFoundError:
        return out
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not re.fullmatch(r"[0-9a-f]{64}", parts[0]):
            raise ValueError(f"{path}:{n}: expected '<sha256 hex> <client id>'")
        out[parts[0]] = parts[1]
    return out


def add_client(path: Path, client_id: str) -> str:
    """Register ``client_id`` in the tokens file; return its new bearer token (not stored)."""
    if not _CLIENT_ID.match(client_id):
        raise InvalidArgument("client id: 1-128 characters of A-Z a-z 0-9 . _ : @ -")
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(f"{token_hash(token)} {client_id}\n")
        f.flush()
        os.fsync(f.fileno())
    return token


class Authenticator:
    """Maps a call's credentials to a client id; ``None`` mode accepts everyone (insecure demos)."""

    def __init__(self, tokens_file: Path | None, enabled: bool = True):
        self.enabled = enabled
        self.tokens_file = tokens_file
        self._tokens: dict[str, str] = {}
        self._stamp = None
        if enabled:
            self._reload()
            if not self._tokens:
                log.warning("no client registered in %s: every Submit is UNAUTHENTICATED until clients are "
                            "added with `lac shuffler add-client` (or clients present mTLS certificates)",
                            tokens_file)

    def _reload(self) -> None:
        try:
            st = os.stat(self.tokens_file)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except (FileNotFoundError, TypeError):
            stamp = None
        if stamp != self._stamp:
            self._tokens = read_tokens(self.tokens_file) if stamp else {}
            self._stamp = stamp

    def identify(self, context) -> str | None:
        """The caller's client id (None when authentication is disabled); raises Unauthenticated."""
        if not self.enabled:
            return None
        peer = peer_identity(context)
        if peer:
            return "mtls:" + peer
        header = ""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                header = value
        if not header.startswith("Bearer ") or not header[7:].strip():
            raise Unauthenticated("missing credentials: send metadata 'authorization: Bearer <token>' "
                                  "(or connect with an mTLS client certificate)")
        self._reload()
        client = self._tokens.get(token_hash(header[7:].strip()))
        if client is None:
            raise Unauthenticated("unknown bearer token")
        return "token:" + client
