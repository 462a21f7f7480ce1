"""The shuffler's release policy: which buffered reports form the next batch, in what order.

A pure function of the buffered rows and the configuration (randomness from the OS CSPRNG:
``lac.common.rng.secure_generator`` for the permutations, ``lac.shuffler.shuffle`` for sub-sampling);
storage (``ReportLog``) only fetches rows and stores the result. The policy never sees a payload: a row
is its key (``seq``), client, window, crowd and payload size, and a batch is a list of keys in shuffled
order; the payloads stay where the log stored them until the batch is forwarded.

In order:
1. One report per client: the rows are put in a uniformly random order and the first report
   of each client is taken; the client's other reports stay buffered for a later batch (so a
   batch never holds two reports of one client, whatever windows they were accepted in).
   Rows without a client (authentication disabled) are all taken and the batch carries no
   distinct-client guarantee.
2. Reserve and threshold: with ``reserve`` > 0 a uniformly random ``reserve`` of the taken reports (drawn
   by a fresh permutation: in step 1's order a client with more reports tends to come first) stay buffered
   for a later batch; nothing is released unless the remaining taken reports number at least ``threshold``.
3. Poisson sub-sampling at rate ``subsample_q`` (secret sample), then the crowd threshold
   (crowds with fewer than ``crowd_threshold`` kept reports are dropped; reports without a
   crowd id form one crowd).
4. A uniform shuffle, cut into consecutive parts of at most ``max_batch_bytes`` (each part of
   one uniform permutation is itself a uniformly random subset in uniform order), none with fewer than
   ``threshold`` reports (``chunks``): a last part below it takes reports from the part before, or is merged
   into it where that one cannot spare them; a part exceeds ``max_batch_bytes`` only when ``threshold`` of
   the release's reports do not fit in it (``Selection.oversized`` says so). After sub-sampling or the crowd
   threshold, a release may hold fewer than ``threshold`` reports: it is then one part.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from lac.common.rng import secure_generator
from lac.shuffler.shuffle import bernoulli_mask

__all__ = ["Row", "Selection", "select_batch", "distinct_clients", "chunks"]


class Row(NamedTuple):
    """One buffered report as the policy sees it: its key in the log, never its payload (only its size in
    bytes, as a batch entry). A named tuple: a release builds one per buffered report."""

    seq: int
    client: bytes | None
    window: int
    crowd: str | None
    size: int


@dataclass(frozen=True)
class Selection:
    """The outcome of one release decision."""

    taken: tuple[int, ...]  # seqs removed from the buffer (released or dropped)
    parts: tuple[tuple[int, ...], ...]  # the seqs of each batch in shuffled order (empty: everything was dropped)
    considered: int
    dropped_subsampled: int
    dropped_crowd: int
    first_window: int
    last_window: int
    distinct_clients: bool  # every released report carries a distinct authenticated client
    oversized: int = 0  # parts over max_batch_bytes (a threshold's reports did not fit in it)

    @property
    def size(self) -> int:
        """Reports released (over all batches)."""
        return sum(len(p) for p in self.parts)


def distinct_clients(rows: Sequence[Row]) -> int:
    """Reports a batch could take now: one per client, plus every report without a client."""
    return len({r.client for r in rows if r.client is not None}) + sum(r.client is None for r in rows)


def chunks(sizes: Sequence[int], max_bytes: int, min_count: int = 1) -> list[tuple[int, int]]:
    """[lo, hi) slices of entries of ``sizes`` bytes whose sums stay within ``max_bytes``, none with fewer than
    ``min_count`` entries (unless there are fewer in all: then one slice).

    A slice closes at the byte limit only once it holds ``min_count`` entries (so it exceeds the limit when that
    many do not fit). A last slice left below ``min_count`` takes entries from the end of the one before, so
    that it holds ``min_count`` of them, when that one keeps ``min_count`` and the last then fits the limit;
    otherwise the two become one slice, over the limit (by fewer than ``min_count`` entries)."""
    out, lo, total = [], 0, 0
    for i, e in enumerate(sizes):
        if total + e > max_bytes and i - lo >= max(min_count, 1):
            out.append((lo, i))
            lo, total = i, 0
        total += e
    if lo < len(sizes):
        out.append((lo, len(sizes)))
    if len(out) > 1 and out[-1][1] - out[-1][0] < min_count:
        (start, _), (_, end) = out[-2], out.pop()
        cut = end - min_count
        if cut - start >= min_count and sum(sizes[cut:end]) <= max_bytes:
            out[-1:] = [(start, cut), (cut, end)]
        else:
            out[-1] = (start, end)
    return out


def select_batch(
    rows: Sequence[Row],
    threshold: int,
    subsample_q: float = 1.0,
    crowd_threshold: int = 0,
    max_batch_bytes: int = 1 << 62,
    reserve: int = 0,
) -> Selection | None:
    """The next batch from ``rows`` (see the module docstring), or None below ``threshold`` + ``reserve``."""
    rng = secure_generator()  # fresh keys from the OS for every batch
    order = rng.permutation(len(rows)).tolist()
    seen: set[bytes] = set()
    taken: list[Row] = []
    for i in order:
        r = rows[i]
        if r.client is not None:
            if r.client in seen:
                continue
            seen.add(r.client)
        taken.append(r)
    if len(taken) - reserve < max(threshold, 1):
        return None
    if reserve:  # a fresh order: in ``taken`` a client with more reports tends to come earlier
        taken = [taken[i] for i in rng.permutation(len(taken))[: len(taken) - reserve].tolist()]
    considered = len(taken)
    kept = taken
    if subsample_q < 1.0:
        kept = [r for r, k in zip(kept, bernoulli_mask(len(kept), subsample_q).tolist()) if k]
    n_sub = considered - len(kept)
    n_crowd = 0
    if crowd_threshold > 0:
        sizes = Counter(r.crowd or "" for r in kept)
        small = {c for c, m in sizes.items() if m < crowd_threshold}
        before = len(kept)
        kept = [r for r in kept if (r.crowd or "") not in small]
        n_crowd = before - len(kept)
    shuffled = [kept[i] for i in rng.permutation(len(kept)).tolist()]
    cut = chunks([r.size for r in shuffled], max_batch_bytes, threshold)
    parts = tuple(tuple(r.seq for r in shuffled[lo:hi]) for lo, hi in cut)
    windows = [r.window for r in kept] or [r.window for r in taken]
    return Selection(
        taken=tuple(r.seq for r in taken),
        parts=parts,
        considered=considered,
        dropped_subsampled=n_sub,
        dropped_crowd=n_crowd,
        first_window=min(windows),
        last_window=max(windows),
        distinct_clients=all(r.client is not None for r in kept),
        oversized=sum(sum(r.size for r in shuffled[lo:hi]) > max_batch_bytes for lo, hi in cut),
    )
