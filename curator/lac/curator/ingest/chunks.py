"""Opening, validating and counting sealed reports on every core.

The work of an ingested batch that does not need the curator's database is done here, by plain
module-level functions of serialized ``SealedPayload`` bytes (picklable, so a worker process or a
Spark executor can run them):

* ``open_chunk``: open each payload (HPKE) and check it against the published deployment and the
  token rules; a report that fails is quarantined with a reason, never failing the chunk.
  Reasons (``lac.common.errors.RejectReason``) come from the envelope's ``PayloadRejected`` (else
  "malformed") or are "invalid" (validation), "mechanism_not_allowed", "epsilon_too_large",
  "epsilon_not_exact" (another ε than the one a curator estimating the clean text deconvolves with),
  "embedding_mismatch", "too_many_words", or "internal" (an unexpected error while opening).
* ``count_chunk``: every n-gram of the accepted reports (``lac.curator.base.ngrams.keyed_report_items``,
  spelled by Arrow), with what ``merge_counts`` needs to combine chunks.
* ``merge_counts``: the counts of the reports a batch keeps (the store drops replayed report ids,
  which needs its database), identical to ``report_items`` over their sentences at once, so the
  batch's segment is byte-identical however the batch was split.

``IngestPool`` runs them on ``workers`` processes (forkserver): a batch is split into chunks, the
chunks' results come back in batch order. The curator starts the workers with the server
(``IngestPool.start``, off the event loop) and keeps them, so no batch waits for processes to start;
a batch of fewer than ``MIN_POOL_BATCH`` reports is opened in the calling process, where the pool's
round trip (pickling the payloads and the counts, merging the chunks) costs more than the second
core saves (measured: ``benchmarks/bench_ingest.py --sizes``). The key ring reaches each worker
once, through the pool's initializer, which also ties the worker's life to the curator's
(``lac.curator.base.lifeline``: a killed curator leaves no worker holding its keys); a worker keeps
nothing else between chunks. Each worker has its own pipe (``lac.curator.base.workers``): one killed
at any instant, the OOM killer's way, fails the batches in the pool at once with UNAVAILABLE (the
shuffler sends them again; the store keeps a batch id once) and the workers are started again, as when
no chunk finishes for ``ingest_stall_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import signal
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from google.protobuf.message import DecodeError

from lac.common import envelope
from lac.common.checks import check_int
from lac.common.deployment import epsilon_problem
from lac.common.errors import LacError, RejectReason
from lac.common.serde import mechanism_id
from lac.common.text import BOS, EOS, UNK
from lac.common.v1 import reports_pb2
from lac.curator.base.lifeline import die_with
from lac.curator.base.ngrams import ReportItems, keyed_report_items, spell
from lac.curator.base.workers import NoWorkers, WorkerPool
from lac.curator.store.store import Quarantined

__all__ = [
    "BatchStatement",
    "IngestBatch",
    "IngestContext",
    "OpenedChunk",
    "CountedChunk",
    "open_chunk",
    "count_chunk",
    "ingest_chunk",
    "merge_counts",
    "IngestPool",
    "MIN_POOL_BATCH",
    "CHUNK_REPORTS",
    "STALL_SECONDS",
]

log = logging.getLogger(__name__)

MAX_DETAIL = 500
MIN_POOL_BATCH = 200
"""Smaller batches are opened in the calling process: the warm pool's round trip would cost more. Measured
with 2 workers on 2 cores (2026-11-25, BENCHMARKS.md): the warm pool beat one in-process worker from 100
reports on (1.26x; 1.43x at 200) while the second core was free, and lost (0.80-0.95x up to 2,000) while
another job held it; a cold pool lost up to 5,000."""
CHUNK_REPORTS = 2000
"""A pooled batch is split into chunks of at most about this many reports, a multiple of the workers."""
STALL_SECONDS = 60.0
"""Default bound on the pool's silence: no chunk finished for this long while batches wait fails them
(``ingest_stall_seconds``); a chunk takes well under a second."""
_RESERVED_TOKENS = frozenset({BOS, EOS, UNK})


@dataclass(frozen=True)
class BatchStatement:
    """What the shuffler states about a batch (read from the wire by the curator's serde): the privacy unit it
    enforced (quota per window, the cap on windows per period), whether each report comes from a distinct
    client, the accounting windows of its reports, its rendered amplification statement, and ``encoded``, the
    statement as received, which the store keeps with the batch."""

    reports_per_window: int
    window_seconds: float
    windows_per_period: int
    period_seconds: float  # 0: a shuffler older than periods
    distinct_clients: bool
    first_window: int
    last_window: int
    statement: str
    encoded: bytes = field(repr=False, default=b"")


@dataclass(frozen=True, eq=False)
class IngestBatch:
    """A batch from the shuffler as ingest sees it: its id, each report's serialized ``SealedPayload``
    (opened and validated by ``open_chunk``) and the shuffler's statement (None: the batch carries none)."""

    batch_id: str
    payloads: list[bytes]
    privacy: BatchStatement | None


@dataclass(frozen=True)
class IngestContext:
    """What opening and validating a report needs: the key ring's private material (secret; not in
    the repr), whether plaintext payloads are accepted, the published deployment's values, the
    curator's caps on reports, and the longest n-gram counted (a curator's: ``CuratorConfig.ingest_context``)."""

    keys: tuple[tuple[str, bytes], ...] = field(repr=False)  # CuratorKeyRing.private_material(); () = no ring
    allow_plaintext: bool
    mechanism: str
    epsilon_per_word: float
    embedding: str
    max_report_words: int
    max_sentences_per_report: int
    max_token_chars: int
    max_n: int
    exact_epsilon: bool = False  # reports at exactly epsilon_per_word only (the deployment's exact_epsilon)


@functools.lru_cache(maxsize=4)
def _keyring(ctx: IngestContext) -> envelope.CuratorKeyRing | None:
    return envelope.CuratorKeyRing.from_private_material(ctx.keys) if ctx.keys else None


@dataclass(frozen=True, eq=False)
class OpenedChunk:
    """The accepted reports of a chunk (ids and sentences, in payload order) and the quarantined
    others (in payload order)."""

    ids: list[bytes]
    sentences: list[list[list[str]]]
    quarantined: list[Quarantined]


@dataclass(frozen=True, eq=False)
class CountedChunk:
    """The accepted reports of a chunk counted: ``items`` has a row per id, with its n-grams as a
    pyarrow string array; ``digits[i, j]`` is the id in ``words`` (a pyarrow string array) of item
    i's j-th word from the end (0 past its first word), ids as
    ``lac.curator.base.ngrams.keyed_report_items`` gives them: "", <s>, </s>, then the words in order
    of first occurrence."""

    ids: list[bytes]
    items: ReportItems
    digits: np.ndarray  # int32, (n_items, max_n)
    words: pa.StringArray
    quarantined: list[Quarantined]


class _Reject(Exception):
    def __init__(self, reason: RejectReason, detail: str):
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def _validate(ctx: IngestContext, content: reports_pb2.ReportContent) -> None:
    """A report must satisfy the published deployment and the token rules; else _Reject."""
    if len(content.report_id) != envelope.REPORT_ID_BYTES:
        raise _Reject(RejectReason.INVALID, f"report_id must be {envelope.REPORT_ID_BYTES} bytes")
    # Details name the rule, a position and a length, never what the report holds (they are logged and stored).
    lp = content.local_privacy
    if lp.mechanism != mechanism_id(ctx.mechanism):
        raise _Reject(
            RejectReason.MECHANISM_NOT_ALLOWED, f"another local mechanism; this deployment accepts {ctx.mechanism}"
        )
    problem = epsilon_problem(lp.epsilon_per_word, ctx.epsilon_per_word, ctx.exact_epsilon)
    if problem == "too_large":
        raise _Reject(
            RejectReason.EPSILON_TOO_LARGE, f"ε per word outside this deployment's 0 < ε ≤ {ctx.epsilon_per_word:g}"
        )
    if problem:
        raise _Reject(
            RejectReason.EPSILON_NOT_EXACT,
            f"ε per word smaller than this deployment's ε = {ctx.epsilon_per_word:g}, the one it takes: the curator "
            f"estimates the users' clean text with the local channel of that ε (clean_estimate), so a report made at "
            f"another would be deconvolved with the wrong channel",
        )
    if lp.embedding != ctx.embedding:
        raise _Reject(
            RejectReason.EMBEDDING_MISMATCH,
            f"another embedding (an id of {len(lp.embedding)} characters); this deployment uses {ctx.embedding}",
        )
    if len(content.sentences) > ctx.max_sentences_per_report:
        raise _Reject(
            RejectReason.INVALID, f"{len(content.sentences)} sentences; at most {ctx.max_sentences_per_report}"
        )
    n_words = 0
    for j, s in enumerate(content.sentences, 1):
        n_words += len(s.tokens)
        for i, t in enumerate(s.tokens, 1):
            if not t or len(t) > ctx.max_token_chars or len(t.split()) != 1 or t.strip() != t or t in _RESERVED_TOKENS:
                raise _Reject(
                    RejectReason.INVALID,
                    f"token {i} of sentence {j} ({len(t)} characters): must be 1..{ctx.max_token_chars} characters, "
                    "no whitespace, not <s>, </s> or <unk>",
                )
    if n_words > ctx.max_report_words:
        raise _Reject(
            RejectReason.TOO_MANY_WORDS,
            f"{n_words} words; this deployment's reports have at most {ctx.max_report_words}",
        )


def open_chunk(ctx: IngestContext, payloads: Sequence[bytes]) -> OpenedChunk:
    """Open and validate each serialized ``SealedPayload``: (report ids, sentences) of the good ones
    and the quarantined others with their reason and raw bytes. Never raises for a bad report."""
    keyring = _keyring(ctx)
    ids, texts, quarantined = [], [], []
    for raw in payloads:
        try:
            try:
                sealed = reports_pb2.SealedPayload.FromString(raw)
            except DecodeError as exc:
                raise _Reject(RejectReason.MALFORMED, f"payload is not a SealedPayload: {exc}") from None
            try:
                c = envelope.open_payload(sealed, keyring, allow_plaintext=ctx.allow_plaintext)
            except LacError as exc:
                reason = exc.reason if isinstance(exc, envelope.PayloadRejected) else RejectReason.MALFORMED
                raise _Reject(reason, str(exc)) from None
            except Exception as exc:  # a bug or library error must not take the batch down
                # its type and where it was raised, never its message, which may quote the report
                where = "".join(traceback.format_tb(exc.__traceback__))
                log.error("unexpected error opening a report: %s, raised at\n%s", type(exc).__name__, where)
                raise _Reject(RejectReason.INTERNAL, f"unexpected {type(exc).__name__} while opening") from None
            _validate(ctx, c)
        except _Reject as r:
            quarantined.append(Quarantined(r.reason, r.detail[:MAX_DETAIL], bytes(raw)))
            continue
        ids.append(bytes(c.report_id))
        texts.append([list(s.tokens) for s in c.sentences])
    return OpenedChunk(ids, texts, quarantined)


def count_chunk(opened: OpenedChunk, max_n: int) -> CountedChunk:
    """Every n-gram (up to ``max_n`` words) of the opened chunk's accepted reports, spelled by Arrow."""
    items, keys, base, words = keyed_report_items(opened.sentences, max_n, spell=False)
    digits = np.empty((keys.size, max_n), dtype=np.int32)
    for j in range(max_n):
        keys, digits[:, j] = np.divmod(keys, base)
    names = pa.array(words, pa.string())
    spelled = spell(names, np.where(digits == 0, -1, digits)[:, ::-1])  # digit 0: no word; the last digit first
    return CountedChunk(
        opened.ids,
        ReportItems(items.indptr, items.item_ids, items.counts, spelled, items.texts),
        digits,
        names,
        opened.quarantined,
    )


def ingest_chunk(ctx: IngestContext, payloads: Sequence[bytes]) -> CountedChunk:
    """``open_chunk`` then ``count_chunk`` (sentences are not kept)."""
    return count_chunk(open_chunk(ctx, payloads), ctx.max_n)


def merge_counts(chunks: Sequence[CountedChunk], keep: Sequence[int]) -> ReportItems:
    """The items of the kept reports (increasing positions in the chunks' ids, concatenated in
    order): exactly ``report_items`` of their sentences counted at once, but ``items`` a pyarrow
    string array (the segment's dictionary, in the same order, so the segment is byte-identical).

    ``report_items`` orders ``items`` by key, of word ids in order of the words' first occurrence
    over all the reports counted: the chunks' words are given those ids (a chunk's words are in
    their order of first occurrence; where a chunk's reports are not all kept, that order over the
    kept ones is the order of their one-word items, as a row lists its items in order of first
    occurrence), then the chunks' items are keyed again and sorted together."""
    kept = np.asarray(keep, dtype=np.int64)
    sizes = [c.items.n_reports for c in chunks]
    if kept.size and (np.any(np.diff(kept) <= 0) or kept[0] < 0 or kept[-1] >= sum(sizes)):
        raise ValueError("kept positions must increase and lie within the chunks")
    if len(chunks) == 1 and kept.size == sizes[0]:  # every report kept: nothing to merge
        return chunks[0].items
    texts = _kept_texts(chunks, kept)
    offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    chunk_of = np.searchsorted(offsets, kept, side="right") - 1
    # Per chunk: the kept rows' entries (None: all), row lengths, words in order.
    entries: list[np.ndarray | None] = []
    lens: list[np.ndarray] = []
    orders: list[np.ndarray] = []
    for ci, c in enumerate(chunks):
        local = kept[chunk_of == ci] - offsets[ci]
        if local.size == sizes[ci]:
            entries.append(None)
            lens.append(np.diff(c.items.indptr))
            orders.append(np.arange(3, len(c.words)))  # after "", <s>, </s>: in order of first occurrence
            continue
        row_lens = np.diff(c.items.indptr)[local]
        sel = np.repeat(c.items.indptr[local] - (np.cumsum(row_lens) - row_lens), row_lens) + np.arange(row_lens.sum())
        d = c.digits[c.items.item_ids[sel]]
        w1, first = np.unique(d[(d[:, 1:] == 0).all(axis=1), 0], return_index=True)  # one-word items
        w1, first = w1[w1 >= 3], first[w1 >= 3]  # not </s>
        entries.append(sel)
        lens.append(row_lens)
        orders.append(w1[np.argsort(first)])
    indptr = np.zeros(kept.size + 1, dtype=np.int64)
    np.cumsum(np.concatenate(lens) if lens else np.zeros(0, np.int64), out=indptr[1:])
    if indptr[-1] == 0:
        return ReportItems(indptr, np.empty(0, np.int32), np.empty(0, np.int32), pa.array([], pa.string()), texts)
    # The words of all chunks in order; Arrow numbers distinct values in order of first appearance.
    encoded = pa.concat_arrays([c.words.take(o) for c, o in zip(chunks, orders)]).dictionary_encode()
    codes = encoded.indices.to_numpy() + 3
    B, max_n = len(encoded.dictionary) + 3, chunks[0].digits.shape[1]
    if B**max_n >= 1 << 62:
        raise ValueError(f"{B - 1} distinct words are too many for 64-bit {max_n}-gram keys")
    used, keys, positions, start, done = [], [], [], 0, 0
    for c, at, o in zip(chunks, entries, orders):
        wm = np.zeros(len(c.words), dtype=np.int64)
        wm[1:3] = 1, 2
        wm[o] = codes[done : done + o.size]
        done += o.size
        if at is None:
            u, d = None, c.digits
        else:
            mask = np.zeros(len(c.digits), dtype=bool)
            mask[c.items.item_ids[at]] = True
            u = np.flatnonzero(mask)
            d = c.digits[u]
        key, scale = wm[d[:, 0]], B
        for j in range(1, max_n):
            key += wm[d[:, j]] * scale
            scale *= B
        used.append(u)
        keys.append(key)
        positions.append(np.arange(start, start + len(c.digits)) if u is None else u + start)
        start += len(c.digits)
    key = np.concatenate(keys)
    bits = max(int(key.size - 1).bit_length(), 1)
    if B**max_n <= 1 << (63 - bits):  # key and position fit in one int64: a plain sort (~3x faster) gives both
        packed = np.sort((key << bits) | np.arange(key.size))
        order, sorted_key = packed & ((1 << bits) - 1), packed >> bits
    else:
        order = np.argsort(key)
        sorted_key = key[order]
    new = np.ones(key.size, dtype=bool)
    new[1:] = sorted_key[1:] != sorted_key[:-1]
    inverse = np.empty(key.size, dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    # Equal keys are the same n-gram: any chunk's copy spells it.
    items = pa.concat_arrays([c.items.items for c in chunks]).take(np.concatenate(positions)[order[new]])
    ids, start = [], 0
    for c, at, u in zip(chunks, entries, used):
        if u is None:
            to_global = inverse[start : start + len(c.digits)]
            ids.append(to_global[c.items.item_ids])
        else:
            to_global = np.zeros(len(c.digits), dtype=np.int64)
            to_global[u] = inverse[start : start + u.size]
            ids.append(to_global[c.items.item_ids[at]])
        start += len(c.digits) if u is None else u.size
    counts = np.concatenate([c.items.counts if at is None else c.items.counts[at] for c, at in zip(chunks, entries)])
    return ReportItems(indptr, np.concatenate(ids).astype(np.int32), counts.astype(np.int32), items, texts)


def _kept_texts(chunks: Sequence[CountedChunk], kept: np.ndarray) -> pa.ListArray | None:
    """The words of the kept reports (positions over the chunks' reports), None if a chunk kept none."""
    parts = [c.items.texts for c in chunks]
    if any(p is None for p in parts):
        return None
    whole = pa.concat_arrays(parts) if parts else pa.array([], pa.list_(pa.string()))
    return whole.take(pa.array(kept, pa.int64()))


# -- the worker processes ----------------------------------------------------------------------

_WORKER_CTX: IngestContext | None = None


def _install(ctx: IngestContext, owner: int) -> None:
    global _WORKER_CTX
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the server, which stops its workers
    die_with(owner)  # and a killed server takes its workers (and their keys) with it
    _WORKER_CTX = ctx
    _keyring(ctx)
    # First-use costs paid now, not by the first chunk (pyarrow imports pandas, if installed, on its first
    # array: ~0.2 s of CPU, which made a new worker's first chunk ~50x slower than the next).
    count_chunk(OpenedChunk([b""], [[["ready"]]], []), ctx.max_n)


def _work(payloads: list[bytes]) -> CountedChunk:
    if _WORKER_CTX is None:
        raise RuntimeError("the ingest worker was not initialised")
    return ingest_chunk(_WORKER_CTX, payloads)


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    bounds = [n * i // parts for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts) if bounds[i] < bounds[i + 1]]


class IngestPool:
    """Runs ``ingest_chunk`` over batches: in the calling process for ``workers`` = 1 or a batch of
    fewer than ``min_pool_batch`` reports (default ``MIN_POOL_BATCH``), else on ``workers`` processes
    (``lac.curator.base.workers.WorkerPool``, forkserver: safe next to gRPC's threads), started by
    ``start`` (the curator calls it when it starts) or on first use and kept warm between batches. A
    worker that dies, or no chunk finishing for ``stall_seconds``, fails the batches in the pool with
    ``Unavailable`` at once and the workers are started again; ``on_change(ok)`` says when the pool
    breaks and when it works again. Where no worker process can be started, batches are opened in the
    calling process."""

    def __init__(
        self,
        ctx: IngestContext,
        workers: int,
        min_pool_batch: int = MIN_POOL_BATCH,
        stall_seconds: float = STALL_SECONDS,
        on_change: Callable[[bool], None] | None = None,
    ):
        workers = check_int(workers, "workers")
        min_pool_batch = check_int(min_pool_batch, "min_pool_batch")
        self.ctx, self.min_pool_batch = ctx, min_pool_batch
        self._pool = (
            WorkerPool(
                workers,
                _install,
                (ctx, os.getpid()),  # the key ring reaches each worker once, here
                _work,
                stall_seconds=stall_seconds,
                stall_setting="ingest_stall_seconds",
                preload=["lac.curator.ingest.chunks"],
                on_change=on_change,
                what="ingest worker",
            )
            if workers > 1
            else None
        )

    @property
    def workers(self) -> int:
        """Processes counting pooled batches (1: every batch in the calling process)."""
        return 1 if self._pool is None or self._pool.gave_up else self._pool.size

    @property
    def ok(self) -> bool:
        """False while the workers are being started again after one died or stalled."""
        return self._pool is None or self._pool.ok

    @property
    def deaths(self) -> int:
        """Times a worker process (or its forkserver) ended on its own."""
        return self._pool.deaths if self._pool is not None else 0

    @property
    def stalls(self) -> int:
        """Times no chunk finished within ``stall_seconds`` while batches waited."""
        return self._pool.stalls if self._pool is not None else 0

    def _chunks(self, payloads: Sequence[bytes]) -> list[list[bytes]]:
        n = len(payloads)
        parts = self.workers * math.ceil(n / (self.workers * CHUNK_REPORTS))  # whole rounds
        return [list(payloads[a:b]) for a, b in _split(n, parts)]

    def pooled(self, n_reports: int) -> bool:
        """Whether a batch of ``n_reports`` goes to the worker processes."""
        return self.workers > 1 and n_reports >= self.min_pool_batch

    def start(self) -> list[int]:
        """Start every worker now (blocking: run it off the event loop) so that no batch waits for them;
        the workers' process ids ([] with one worker, where no process can be started, or when the pool was
        closed meanwhile). Never raises."""
        return self._pool.start() if self._pool is not None else []

    def run(self, payloads: Sequence[bytes]) -> list[CountedChunk]:
        """The batch's chunks counted, in batch order (blocking). ``Unavailable`` if a worker died or
        stalled, or the pool was closed."""
        if self._pool is not None and self.pooled(len(payloads)):
            with contextlib.suppress(NoWorkers):  # logged by the pool: counted here instead
                return self._pool.map(self._chunks(payloads))
        return [ingest_chunk(self.ctx, payloads)]

    async def count(self, payloads: Sequence[bytes]) -> list[CountedChunk]:
        """``run`` without blocking the event loop."""
        if self._pool is not None and self.pooled(len(payloads)):
            with contextlib.suppress(NoWorkers):
                return await self._pool.amap(self._chunks(payloads))
        return [await asyncio.to_thread(ingest_chunk, self.ctx, payloads)]

    def worker_pids(self) -> list[int]:
        """The process ids of the running workers (none before they started, or while they are restarted)."""
        return self._pool.pids() if self._pool is not None else []

    def close(self) -> None:
        """Kill the workers, without waiting for the chunks they run (their batches answer ``Unavailable``);
        later pooled batches are refused."""
        if self._pool is not None:
            self._pool.close()
