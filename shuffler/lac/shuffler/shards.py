"""Which shuffler replica serves which client: rendezvous (highest-random-weight) hashing.

Operators may run several shuffler replicas, each with its own report log, quota table and
idempotency ids. The per-client quota (the privacy unit: one client over an accounting window)
holds only if every report of a client goes to the same replica, so each client has exactly one
shard and the others refuse it (FAILED_PRECONDITION naming the right one).

A client's shard is the entry of the shard list with the largest weight::

    shard(client_id) = argmax over s in shards of SHA-256(s || "\\0" || client_id)

where ``s`` is the replica's public address ("host:port", as listed), ``client_id`` the client's
identity as the quota counts it (``token:<id from the tokens file>`` or ``mtls:<certificate common
name>``), both UTF-8, and digests compare as big-endian numbers.

Why rendezvous hashing rather than ``hash(client) mod n``: a client's weight for a shard depends on
that client and that shard only. Adding a shard moves exactly the clients for which the new shard
now has the largest weight (about 1/(n+1) of them, all of them *to* the new shard), and removing a
shard moves only that shard's clients (each to its own runner-up); every other client keeps its
shard. With ``mod n`` almost every client would move, and each moved client would get a fresh quota
on its new replica in the window of the change. Even so, a client that moves mid-window gets a
fresh quota on its new shard, so the list may change only at a window boundary
(``shards_effective_window``).

The assignment needs no coordination: every replica (and the SDK, through ``GetShards``) computes it
from the same list, and it is independent of the order in which the list is written. Hence the list's
``shards_digest``: replicas given different lists would each take a client as their own (two reports in
one window for a quota of one), so each publishes the digest of its list in ``GetShards``; the SDK
submits only to a replica whose digest is its bootstrap replica's, and sends that digest with each
Submit (``SHARDS_DIGEST_METADATA_KEY``), which a replica with another list refuses.

The handlers of a replica over its shard list are here too: ``check_shard`` (Submit's first check: a sharded replica
refuses another replica's client before looking at its reports, ``WrongShard``: FAILED_PRECONDITION naming the right
replica, counted as reject ``wrong_shard``), ``assignment`` (what ``GetShards`` answers) and ``note_shard_change``
(the start's warning when the list changed and applies at once).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lac.common.errors import ErrorReason, FailedPrecondition, RejectReason, Unavailable
from lac.common.storage import storage_failure_reason

if TYPE_CHECKING:
    from lac.shuffler.state import ShufflerState

__all__ = [
    "SHARD_METADATA_KEY",
    "SHARDS_DIGEST_METADATA_KEY",
    "parse_shards",
    "shards_digest",
    "shard_weight",
    "assign_shard",
    "WrongShard",
    "ShardListMismatch",
    "ShardAssignment",
    "assigned_shard",
    "check_shard",
    "assignment",
    "note_shard_change",
]

log = logging.getLogger(__name__)

SHARD_METADATA_KEY = "lac-shard"  # trailing metadata of a wrong-shard refusal: the address to submit to
SHARDS_DIGEST_METADATA_KEY = "lac-shards-digest"  # a Submit's: the list its client was routed by

_ADDRESS = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?):([0-9]{1,5})")


def parse_shards(text: str) -> tuple[str, ...]:
    """The shard list of a comma-separated ``text`` of "host:port" addresses ("" = not sharded).

    ValueError for an entry that is not host:port (port 1-65535) or an address listed twice."""
    shards = tuple(part.strip() for part in text.split(",") if part.strip())
    for address in shards:
        m = _ADDRESS.fullmatch(address)
        if m is None or not 1 <= int(m.group(1)) <= 65535:
            raise ValueError(f"shards: {address[:80]!r} is not a replica address host:port (port 1-65535)")
    repeated = sorted({a for a in shards if shards.count(a) > 1})
    if repeated:
        raise ValueError(f"shards: {', '.join(repeated)} listed more than once")
    return shards


def shards_digest(shards: Iterable[str]) -> str:
    """SHA-256 (hex) of the shard list sorted and joined by newlines ("" for no list): equal for replicas that
    agree on the list, whatever order each was given it in."""
    shards = sorted(shards)
    return hashlib.sha256("\n".join(shards).encode()).hexdigest() if shards else ""


def shard_weight(shard: str, client_id: str) -> bytes:
    """The rendezvous weight of ``shard`` for ``client_id``: SHA-256(shard || 0x00 || client_id)."""
    return hashlib.sha256(shard.encode() + b"\0" + client_id.encode()).digest()


def assign_shard(client_id: str, shards: Iterable[str]) -> str:
    """The shard of ``client_id``: the entry of ``shards`` with the largest weight (ValueError if empty).

    Ties (a SHA-256 collision) go to the larger address, so the result never depends on list order."""
    shards = tuple(shards)
    if not shards:
        raise ValueError("no shards to assign a client to")
    return max(shards, key=lambda s: (shard_weight(s, client_id), s))


class WrongShard(FailedPrecondition):
    """A sharded replica's refusal: the calling client belongs to the replica at ``shard``."""

    def __init__(self, shard: str, this_replica: str):
        super().__init__(
            f"this client belongs to the shuffler replica at {shard}, not to {this_replica}: send the "
            f"same reports there (trailing metadata lac-shard); nothing was stored here",
            reason=RejectReason.WRONG_SHARD,
        )
        self.shard = shard


class ShardListMismatch(FailedPrecondition):
    """A replica's refusal of a Submit routed by another shard list (``digest``) than its own (``own``)."""

    def __init__(self, digest: str, own: str):
        super().__init__(
            f"this client was routed by a shard list (digest {digest[:16] or 'none: not sharded'}) other than "
            f"this replica's (digest {own[:16] or 'none: not sharded'}): the shuffler replicas' --shards differ, "
            f"tell their operator; nothing was stored here",
            reason=RejectReason.SHARD_LIST_MISMATCH,
        )
        self.own = own


@dataclass(frozen=True)
class ShardAssignment:
    """What ``GetShards`` answers a client: the shard list, this replica's entry and the client's shard."""

    shards: tuple[str, ...]
    shard_name: str
    assigned_shard: str  # "" when not sharded or for an anonymous caller
    effective_window: int
    shards_digest: str
    store_id: str


def note_shard_change(state: ShufflerState) -> None:
    """Log the shard topology; warn when it differs from the one this state directory last served
    with and applies at once (a client that moves mid-window gets a fresh quota on its new replica)."""
    cfg = state.config
    window = state.window()
    current = {
        "shards": sorted(state.shards),
        "shard_name": cfg.shard_name,
        "effective_window": cfg.shards_effective_window,
    }
    stored = state.reportlog.get_meta("shards")
    previous = json.loads(stored) if stored else None
    if state.shards:
        log.info(
            "shard %s of %d replicas (%s), applying from window %d (now %d)",
            cfg.shard_name,
            len(state.shards),
            ", ".join(state.shards),
            cfg.shards_effective_window,
            window,
        )
    if previous is not None and previous["shards"] != current["shards"] and cfg.shards_effective_window <= window:
        log.warning(
            "SHARD LIST CHANGED (was %s) and applies at once, in window %d: unless every replica "
            "switched at this window's start, a client that moved replica gets a fresh quota on its new "
            "one for the rest of this window. Change the list at a window boundary: give every replica "
            "the new list with shards_effective_window set to the next window",
            ", ".join(previous["shards"]) or "not sharded",
            window,
        )
    if previous != current:
        try:
            state.reportlog.set_meta("shards", json.dumps(current).encode())
        except Exception as exc:
            if storage_failure_reason(exc) is None:
                raise
            log.warning("could not record the shard list in the report log (%s)", exc)


def assigned_shard(state: ShufflerState, client_id: str | None) -> str | None:
    """The address of the replica that serves ``client_id`` (None: not sharded, or an anonymous caller)."""
    if not state.shards or client_id is None:
        return None
    return assign_shard(client_id, state.shards)


def check_shard(state: ShufflerState, client_id: str | None, n_reports: int, digest: str | None = None) -> None:
    """Refuse (and count as rejects) ``n_reports`` reports of a client this replica does not serve:
    ``ShardListMismatch`` for a client routed by another list (``digest``, None: the client sent none),
    ``WrongShard`` for another replica's client, ``Unavailable`` before the shard list applies."""
    if digest is not None and digest != state.shards_digest:
        state.count_reject(RejectReason.SHARD_LIST_MISMATCH, n_reports)
        raise ShardListMismatch(digest, state.shards_digest)
    home = assigned_shard(state, client_id)
    if home is None:
        return
    start = state.config.shards_effective_window
    if state.window() < start:
        state.count_reject(RejectReason.SHARDS_NOT_EFFECTIVE, n_reports)
        wait = start * state.config.window_seconds - time.time()
        raise Unavailable(
            f"this replica's shard list applies from accounting window {start} (in {wait:.0f} s); retry then",
            retry_after=wait,
            reason=RejectReason.SHARDS_NOT_EFFECTIVE,
            error_reason=ErrorReason.NOTHING_STORED,
        )
    if home != state.config.shard_name:
        state.count_reject(RejectReason.WRONG_SHARD, n_reports)
        raise WrongShard(home, state.config.shard_name)


def assignment(state: ShufflerState, client_id: str | None) -> ShardAssignment:
    """What ``GetShards`` answers ``client_id``: the shard list, this replica's entry and the client's shard."""
    return ShardAssignment(
        shards=tuple(state.shards),
        shard_name=state.config.shard_name,
        assigned_shard=assigned_shard(state, client_id) or "",
        effective_window=state.config.shards_effective_window,
        shards_digest=state.shards_digest,
        store_id=state.store_id,
    )
