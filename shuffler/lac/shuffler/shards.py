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
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

__all__ = [
    "SHARD_METADATA_KEY",
    "SHARDS_DIGEST_METADATA_KEY",
    "parse_shards",
    "shards_digest",
    "shard_weight",
    "assign_shard",
]

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
