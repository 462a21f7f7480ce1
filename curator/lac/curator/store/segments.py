"""Segments: the curator's per-batch record of what each report said, as Parquet files.

One immutable file per ingested batch, ``segments/window=<last window>/<name>.parquet`` (zstd),
one row per (report, distinct n-gram) with columns

    report int32   the report's index within the batch (reports never span files)
    pos    int16   the n-gram's rank within the report, in order of first occurrence
    ngram  string  dictionary-encoded: tokens joined by spaces, as ``lac.curator.base.ngrams.ngrams``
    count  int32   raw occurrences in the report (no cap, no clamp)

and the batch id, its windows, n (orders) and the format version in the file's key-value
metadata. A segment never holds a report's words as such: those are kept, for export only, in a
separate file per batch (``lac.curator.store.export.write_words``). Segments written by earlier
versions may have a ``words`` column (``WORDS``), which no reader uses; ``strip_words`` rewrites
them without it (``lac curator migrate-segments``). Every n-gram of a report is kept,
also those outside the public vocabulary (DP discovery needs them); words are stored as the
report had them, and read as ``<unk>`` against a vocabulary's word list only when a release
reads them (``read_blocks``). The same table is
what a DP library with per-record ids takes as input (Tumult's ``AddRowsWithID``, PipelineDP's
privacy id): ``report`` plus the file is the record id.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lac.common.errors import DataLoss
from lac.common.files import atomic_file
from lac.common.text import BOS, EOS, UNK
from lac.curator.base.ngrams import NgramVocabulary, ReportItems, item_array, spell

__all__ = [
    "FORMAT",
    "SCHEMA",
    "WORDS",
    "write",
    "read",
    "read_blocks",
    "map_words",
    "metadata",
    "table",
    "has_words",
    "strip_words",
]

FORMAT = "lac-segment/2"
MAX_POS = np.iinfo(np.int16).max
SCHEMA = pa.schema(
    [
        pa.field("report", pa.int32(), nullable=False),
        pa.field("pos", pa.int16(), nullable=False),
        pa.field("ngram", pa.dictionary(pa.int32(), pa.string()), nullable=False),
        pa.field("count", pa.int32(), nullable=False),
    ]
)
WORDS = pa.field("words", pa.list_(pa.string()), nullable=True)
"""The column of each report's words that segments of earlier versions have (on its first row)."""
_NGRAM_COLUMNS = ["report", "ngram", "count"]
_STATISTICS_COLUMNS = ["report", "pos", "count"]  # the integer columns: cheap min/max in the file's footer


def table(items: ReportItems, meta: dict | None = None) -> pa.Table:
    """The segment table of ``items`` (with ``meta`` in its schema metadata); ``items.texts`` is not stored."""
    lens = np.diff(items.indptr)
    if lens.size and lens.max() > MAX_POS + 1:
        raise ValueError(f"a report has {int(lens.max())} distinct n-grams, more than a segment holds ({MAX_POS + 1})")
    report = np.repeat(np.arange(items.n_reports, dtype=np.int32), lens)
    pos = (np.arange(items.item_ids.size) - np.repeat(items.indptr[:-1], lens)).astype(np.int16)
    ngram = pa.DictionaryArray.from_arrays(pa.array(items.item_ids, pa.int32()), item_array(items.items))
    schema = SCHEMA.with_metadata({"lac": json.dumps({"format": FORMAT, "n_reports": items.n_reports, **(meta or {})})})
    columns = [pa.array(report), pa.array(pos), ngram, pa.array(items.counts, pa.int32())]
    return pa.Table.from_arrays(columns, schema=schema)


def has_words(path: Path) -> bool:
    """Whether the segment at ``path`` has the ``words`` column of earlier versions."""
    return WORDS.name in pq.read_schema(path).names


def strip_words(path: Path) -> bool:
    """Rewrite the segment at ``path`` without the ``words`` column of earlier versions (durably, in place:
    only with no curator running); False if it has none."""
    if not has_words(path):
        return False
    t = pq.read_table(path)
    _write(path, t.drop_columns([WORDS.name]).replace_schema_metadata(t.schema.metadata))
    return True


def write(path: Path, items: ReportItems, meta: dict | None = None) -> None:
    """Write a segment durably (fsync'd, then renamed into place): a reader sees all of it or none."""
    _write(path, table(items, meta))


def _write(path: Path, t: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with atomic_file(path) as f:
        # One row group: a reader then decodes one dictionary, not one per group to unify (2x faster). No
        # min/max statistics of the n-gram strings: nothing filters on them, and they were a third of the write.
        pq.write_table(
            t, f, compression="zstd", row_group_size=max(1, t.num_rows), write_statistics=_STATISTICS_COLUMNS
        )


def metadata(path: Path) -> dict:
    """The ``lac`` key-value metadata of a segment file."""
    md = pq.read_schema(path).metadata or {}
    return json.loads(md[b"lac"])


def read(path: Path) -> ReportItems:
    """A segment back as ``ReportItems`` (rows in report, then first-occurrence order)."""
    t = pq.read_table(path, columns=_NGRAM_COLUMNS, read_dictionary=["ngram"])
    info = json.loads((t.schema.metadata or {})[b"lac"])
    if info.get("format") != FORMAT:
        raise ValueError(f"{path}: unsupported segment format {info.get('format')!r}")
    n = int(info["n_reports"])
    report = t.column("report").to_numpy()
    ngram = t.column("ngram").combine_chunks()
    if report.size and (np.any(np.diff(report) < 0) or report[-1] >= n):
        raise ValueError(f"{path}: rows are not in report order")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(report, minlength=n), out=indptr[1:])
    return ReportItems(
        indptr,
        ngram.indices.to_numpy().astype(np.int32, copy=False),
        t.column("count").to_numpy().astype(np.int32, copy=False),
        ngram.dictionary,  # Arrow strings: a release turns only what it needs into Python strings
    )


@functools.lru_cache(maxsize=4)
def _known_words(words: frozenset[str]) -> pa.Array:
    """The words read as themselves (the vocabulary's and the special tokens), as an Arrow value set."""
    return pa.array(sorted(words | {BOS, EOS, UNK}), pa.string())


def map_words(items: ReportItems, words: frozenset[str]) -> ReportItems:
    """Read every word outside ``words`` as ``<unk>``: n-grams that become equal are merged within
    each report (counts added, kept at the first occurrence of either). Vectorized: the items' words
    are split and numbered once (Arrow), each item becomes an integer key of its mapped words, and only
    the distinct mapped items are spelled again, numbered in sorted order (UTF-8 byte order is
    code-point order, as ``sorted`` gives)."""
    tokens = pc.split_pattern(item_array(items.items), " ")
    encoded = pc.dictionary_encode(tokens.flatten())
    dictionary = encoded.dictionary
    known = pc.is_in(dictionary, value_set=_known_words(words)).to_numpy(zero_copy_only=False)
    if known.all():  # every word known (or no item): nothing to map
        return items
    unk = pc.index(dictionary, UNK).as_py()
    if unk < 0:
        unk, dictionary = len(dictionary), pa.concat_arrays([dictionary, pa.array([UNK], pa.string())])
    code = np.where(known, np.arange(known.size), unk)[encoded.indices.to_numpy()]  # each word, mapped
    starts = tokens.offsets.to_numpy()
    lens = np.diff(starts)
    starts = starts[:-1]
    base = len(dictionary) + 1
    key = np.zeros(lens.size, dtype=np.int64)
    for j in range(int(lens.max(initial=0))):
        if key.size and int(key.max()) >= (2**62) // base:  # renumber densely before the key would overflow
            key = np.unique(key, return_inverse=True)[1].astype(np.int64)
        has = lens > j
        key *= base
        key[has] += code[starts[has] + j] + 1
    distinct, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    reps_start, reps_len = starts[first], lens[first]
    codes = np.full((distinct.size, int(reps_len.max(initial=0))), -1, dtype=np.int64)
    for j in range(codes.shape[1]):
        has = reps_len > j
        codes[has, j] = code[reps_start[has] + j]
    spelled = spell(dictionary, codes)
    order = pc.sort_indices(spelled).to_numpy()
    names = spelled.take(pa.array(order))
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size)
    ids = rank[inverse.reshape(-1)][items.item_ids]
    n = items.n_reports
    lens = np.diff(items.indptr)
    row = np.repeat(np.arange(n), lens)
    pos = np.arange(ids.size)
    if n * (len(names) + 1) < 2**63:  # one int64 key: its stable sort is lexsort((pos, ids, row)), 4x faster
        order = np.argsort(row * np.int64(len(names)) + ids, kind="stable")
    else:
        order = np.lexsort((pos, ids, row))
    row, ids, pos, counts = row[order], ids[order], pos[order], items.counts[order]
    first = np.ones(ids.size, dtype=bool)
    first[1:] = (ids[1:] != ids[:-1]) | (row[1:] != row[:-1])
    start = np.flatnonzero(first)
    summed = np.add.reduceat(counts, start) if start.size else counts[:0]
    g_row, g_id, g_pos = row[start], ids[start], pos[start]
    by_pos = np.argsort(g_pos, kind="stable")  # positions grow with the row: this is (row, first occurrence)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(g_row, minlength=n), out=indptr[1:])
    return ReportItems(indptr, g_id[by_pos].astype(np.int32), summed[by_pos].astype(np.int32), names)


def read_blocks(paths: list[Path], vocab: NgramVocabulary | None = None) -> Iterator[ReportItems]:
    """The segments at ``paths`` one at a time (bounded memory), words read against ``vocab``'s list
    when it has ``<unk>``."""
    for p in paths:
        try:
            block = read(p)
        except (OSError, ValueError, KeyError, pa.ArrowException) as exc:
            raise DataLoss(f"segment {p.name} of an acknowledged batch is missing or corrupt: {exc}") from exc
        yield map_words(block, vocab.words) if vocab is not None and vocab.has_unk else block


def segment_name(batch_id: str, last_window: int) -> str:
    """The relative path of a batch's segment: partitioned by the window of its newest report."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in batch_id)[:96]
    return os.path.join(f"window={int(last_window)}", f"{safe}-{os.urandom(4).hex()}.parquet")
