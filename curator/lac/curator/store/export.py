"""Export of privatized reports (opt-in): the words of the reports of closed windows, as a data set.

Which reports: each batch belongs to one window, its last
---------------------------------------------------------
A batch's reports may span windows (w..w+1, say). For exports it belongs to its last window only, so
the export of a range is exactly the union of its windows' exports and no set of exports isolates a
batch by differencing (a batch in the export of w..w+1 but in neither w's nor w+1's would be). A window
is exported only once settled: closed for longer than ``shuffler_release_interval_seconds`` (a shuffler
may release its reports up to that long after the window closes) plus ``forward_horizon_seconds`` (how
long a released batch may take to arrive); after its first export, a batch that belongs to it is
refused (FAILED_PRECONDITION, ``ErrorReason.WINDOW_EXPORTED``: the shuffler keeps it and should not retry
it), so two exports of one window never differ.

Where the words come from
-------------------------
Only while export is on (``export_identities`` non-empty) does ingest keep each batch's words, in a
file of its own beside its segment (``write_words``: ``words/window=<w>/<name>.parquet``, one row per
report with words, column ``words``), and only for ``export_retention_days`` after the window closes:
then the curator deletes it (``CuratorStore.purge_words``), as it deletes every such file at start
when export is off. Releases never read these files: they read the segments' n-gram counts. Backups do
not copy them. A batch without its words file cannot be exported.

What leaves the curator: one row per stored report that has words, holding those words only (column
``words``, list<string>, the report's sentences concatenated, as the device perturbed them) — no batch
id, time, window, order, position, segment or anything else that could tie a row to a batch, and so
to a client or a time. Its guarantee is ``lac.common.privacy.LocalGuarantee``: per-word metric DP on
the device, at most L words per report, k reports per client per window, the shuffler's accountant per
window, and no central DP. Every export is recorded with the ledger (who, when, which windows, rows)
before its first row is sent; it charges nothing.

The order of the rows
---------------------
Segments are written per batch, and batches can be small (a shuffler's ``min_batch``), so any order
derived from storage leaks: rows of one batch next to each other say which reports arrived together
(a per-segment shuffle in a random segment order keeps every batch contiguous). Sorting by content would
be sound (a function of the multiset of rows only) but needs an external sort. The rows come instead in
a uniformly random permutation, drawn from the OS CSPRNG per export, with bounded memory (Sanders 1998,
"Random permutations on distributed, external and hierarchical memory"):

1. each row is sent to one of B spool files (Arrow IPC, under ``state_dir/export-spool``, 0700)
   independently and uniformly, with B = ⌈expected rows / ``BUCKET_ROWS``⌉;
2. each spool file in turn is read whole, permuted uniformly, and streamed.

The result is a uniform permutation of all rows: the bucket labels are i.i.d. and each bucket's order
is a fresh uniform permutation that ignores the order its rows were written in, so the law of the output
is invariant under any relabelling of the input positions, hence uniform. Memory holds one segment's
record batch (``READ_ROWS`` rows) in step 1 and one bucket (about ``BUCKET_ROWS`` rows) in step 2; with
a single bucket nothing is spooled. The spool holds what the segments hold and is removed when the export
ends (and at the next start after a crash).
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lac.common.deployment import Deployment
from lac.common.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from lac.common.exports import SCHEMA, ipc_bytes
from lac.common.files import atomic_file, private_dir
from lac.common.privacy import LocalGuarantee, WindowShuffle
from lac.common.rng import RandomSource
from lac.common.rpc import Role
from lac.common.v1 import reports_pb2

__all__ = [
    "BUCKET_ROWS",
    "SPOOL_DIR",
    "WORDS_DIR",
    "write_words",
    "MAX_WINDOWS",
    "ShuffledReports",
    "check_grant",
    "check_windows",
    "clear_spool",
    "local_guarantee",
    "next_ipc",
    "window_shuffles",
]


"""The exported rows: one per report, its words only."""
BUCKET_ROWS = 100_000
"""Rows per spool bucket (expected): what step 2 holds in memory (~10 MB at ten words a report)."""
MAX_BUCKETS = 4096
READ_ROWS = 65_536
"""Rows of a segment read at a time in step 1."""
CHUNK_BYTES = 1 << 20
"""About this many bytes of Arrow data per streamed message."""
SPOOL_DIR = "export-spool"
WORDS_DIR = "words"
"""Where, under the state directory, the batches' words files are (while export is on)."""
MAX_WINDOWS = 100_000


def write_words(path: Path, texts: pa.ListArray) -> int:
    """Write one batch's words durably (fsync'd, renamed into place): a row per report that has words (the
    report's words in order, its sentences concatenated), in batch order; returns the rows written."""
    kept = texts.filter(pc.greater(pc.list_value_length(texts), 0))
    table = pa.table([kept.cast(SCHEMA.field("words").type)], schema=SCHEMA)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with atomic_file(path) as f:
        pq.write_table(table, f, compression="zstd")
    return len(kept)


def check_grant(export_identities: frozenset[str], roles: frozenset[Role]) -> None:
    """PermissionDenied unless export is on (``export_identities`` non-empty) and the caller holds the grant."""
    if not export_identities:
        raise PermissionDenied(
            "export of privatized reports is off on this curator (the default); its operator can turn it on for "
            "named mTLS identities with export_identities (lac curator serve --export-identities NAME[,NAME])"
        )
    if Role.EXPORT not in roles:
        raise PermissionDenied(
            "this identity may not export privatized reports: the operator grants it by adding its certificate's "
            "common name to export_identities (analysts and operators need the grant too)"
        )


def check_windows(
    first: int, last: int, deployment: Deployment, now: float | None = None, settle_seconds: float = 0.0
) -> None:
    """InvalidArgument for a range that is empty, before window 0, too long or beyond the current window;
    FailedPrecondition while its last window is still open or has been closed for less than ``settle_seconds``
    (the shufflers' release interval plus the forwarding horizon: batches of its reports may still come)."""
    if first < 0:
        raise InvalidArgument(f"window {first}: accounting windows count from 0 (unix time // window_seconds)")
    if first > last:
        raise InvalidArgument(f"first window {first} is after last window {last}")
    if last - first + 1 > MAX_WINDOWS:
        raise InvalidArgument(f"an export covers at most {MAX_WINDOWS:,} windows, not {last - first + 1:,}")
    now = time.time() if now is None else now
    current = deployment.window(now)
    if last > current:
        raise InvalidArgument(f"window {last} is after the current window {current}: no report can be stored there yet")
    if last == current:
        closes = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime((last + 1) * deployment.window_seconds))
        raise FailedPrecondition(
            f"window {last} is still open (it closes at {closes}): only the reports of closed windows are exported; "
            f"end the export at window {last - 1} or wait"
        )
    settled = (last + 1) * deployment.window_seconds + settle_seconds
    if now < settled:
        at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(settled))
        raise FailedPrecondition(
            f"window {last} is closed but not settled until {at} ({settle_seconds:g} s after it closed: "
            f"shuffler_release_interval_seconds + forward_horizon_seconds), since batches of its reports may still "
            f"come; a window is exported once settled, and batches for it are refused after that"
        )


def clear_spool(state_dir: Path) -> None:
    """Remove what exports left in the spool (a curator that stopped during one); call at start."""
    shutil.rmtree(state_dir / SPOOL_DIR, ignore_errors=True)


def window_shuffles(
    batches: Iterable[tuple[int, int, int, bytes | None]], first: int, last: int, deployment: Deployment
) -> tuple[WindowShuffle, ...]:
    """The shuffle accountant's statements per window of ``first``..``last`` from the stored batches
    (first window, last window, accepted reports, serialized ``BatchPrivacy``): a batch counts in its last
    window, the one it belongs to for exports. A batch without a statement, with one computed for a smaller ε0
    than the deployment's (it would overstate the amplification) or not bound to distinct clients is
    unverified."""
    eps0 = deployment.report_epsilon0
    per: dict[int, list[tuple[int, reports_pb2.BatchPrivacy | None]]] = defaultdict(list)
    for _, b, n, blob in batches:
        if first <= b <= last:
            per[b].append((n, reports_pb2.BatchPrivacy.FromString(blob) if blob else None))
    out = []
    for w in sorted(per):
        rows = per[w]
        stated = [
            (n, p)
            for n, p in rows
            if p is not None and p.distinct_clients and p.report_epsilon0 >= eps0 * (1 - 1e-9) and p.central_epsilon > 0
        ]
        amplified = len(stated) == len(rows) and all(p.amplified and p.central_epsilon < eps0 for _, p in stated)
        eps, delta, method = eps0, 0.0, "none"
        if amplified:
            weakest = max((p for _, p in stated), key=lambda p: p.central_epsilon)
            eps, delta, method = weakest.central_epsilon, weakest.delta, weakest.method
        out.append(
            WindowShuffle(
                window=w,
                batches=len(rows),
                reports=sum(n for n, _ in rows),
                smallest_batch=min(n for n, _ in rows),
                epsilon=eps,
                delta=delta,
                amplified=amplified,
                method=method,
                unverified=len(rows) - len(stated),
            )
        )
    return tuple(out)


def local_guarantee(
    deployment: Deployment, first: int, last: int, rows: int, shuffles: tuple[WindowShuffle, ...]
) -> LocalGuarantee:
    """The typed guarantee of an export of ``rows`` reports of windows ``first``..``last`` under ``deployment``."""
    d = deployment
    return LocalGuarantee(
        mechanism=d.mechanism,
        epsilon_per_word=d.epsilon_per_word,
        embedding=d.embedding,
        word_distance_bound=d.word_distance_bound,
        max_report_words=d.max_report_words,
        reports_per_window=d.reports_per_window,
        window_seconds=d.window_seconds,
        first_window=first,
        last_window=last,
        rows=rows,
        shuffles=shuffles,
    )


def next_ipc(chunks: Iterator[pa.Array]) -> bytes | None:
    """The next array of ``chunks`` as ``ipc_bytes``, None at the end (one step, for a worker thread)."""
    col = next(chunks, None)
    return None if col is None else ipc_bytes(col)


def _file_words(path: Path) -> Iterator[pa.Array]:
    """The rows of a batch's words file, ``READ_ROWS`` at a time."""
    f = pq.ParquetFile(path)
    for batch in f.iter_batches(batch_size=READ_ROWS, columns=[SCHEMA.field("words").name]):
        col = batch.column(0)
        if len(col):
            yield col


class ShuffledReports:
    """The words of the reports in ``paths`` (the batches' words files), in a uniformly random order (module
    docstring).

    The constructor runs step 1 (reads every file, spools when there is more than one bucket); ``rows`` is
    then exact. ``chunks()`` runs step 2 once; ``close()`` (or the context manager) removes the spool."""

    def __init__(
        self,
        paths: list[Path],
        rng: RandomSource,
        expected_rows: int,
        spool_root: Path,
        bucket_rows: int = BUCKET_ROWS,
    ):
        self._rng = rng
        self.buckets = max(1, min(MAX_BUCKETS, math.ceil(expected_rows / max(1, bucket_rows))))
        self.rows = 0
        self._memory: list[pa.Array] = []
        self._files: list[Path] = []
        self._dir: Path | None = None
        try:
            self._spool(paths, spool_root)
        except BaseException:
            self.close()
            raise

    def _spool(self, paths: list[Path], spool_root: Path) -> None:
        if self.buckets == 1:
            for p in paths:
                for col in _file_words(p):
                    self._memory.append(col)
                    self.rows += len(col)
            return
        self._dir = Path(tempfile.mkdtemp(prefix="export-", dir=private_dir(spool_root)))
        self._files = [self._dir / f"{k}.arrow" for k in range(self.buckets)]
        sinks = [pa.OSFile(str(f), "wb") for f in self._files]
        writers = [pa.ipc.new_stream(s, SCHEMA) for s in sinks]
        try:
            for p in paths:
                for col in _file_words(p):
                    n = len(col)
                    label = np.asarray(self._rng.choice(self.buckets, size=n), dtype=np.int64)
                    order = np.argsort(label, kind="stable")
                    grouped = col.take(pa.array(order))
                    counts = np.bincount(label, minlength=self.buckets)
                    start = 0
                    for k in np.flatnonzero(counts):
                        c = int(counts[k])
                        writers[k].write_batch(pa.record_batch([grouped.slice(start, c)], schema=SCHEMA))
                        start += c
                    self.rows += n
        finally:
            for w, s in zip(writers, sinks):
                w.close()
                s.close()

    def _permuted(self, col: pa.Array) -> pa.Array:
        return col.take(pa.array(np.asarray(self._rng.permutation(len(col)), dtype=np.int64))) if len(col) > 1 else col

    def _buckets(self) -> Iterator[pa.Array]:
        if self._dir is None:
            whole = pa.concat_arrays(self._memory) if self._memory else pa.array([], SCHEMA.field("words").type)
            self._memory = []
            yield self._permuted(whole)
            return
        for f in self._files:
            with pa.memory_map(str(f)) as source:
                table = pa.ipc.open_stream(source).read_all()
                col = table.column(0).combine_chunks() if table.num_rows else None
                if col is not None:
                    yield self._permuted(col)
            f.unlink()

    def chunks(self, chunk_bytes: int = CHUNK_BYTES) -> Iterator[pa.Array]:
        """Step 2: the rows, permuted, in arrays of about ``chunk_bytes`` bytes each."""
        for col in self._buckets():
            n = len(col)
            if not n:
                continue
            per = max(1, int(chunk_bytes * n / max(1, col.nbytes)))
            for start in range(0, n, per):
                yield col.slice(start, per)

    def close(self) -> None:
        """Remove the spool (idempotent)."""
        self._memory = []
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> ShuffledReports:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
