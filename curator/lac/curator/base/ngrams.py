"""N-gram items, the public release vocabulary, and per-report (per-user) sparse counts.

An *item* is an n-gram (1 <= n <= max_n) of a sentence padded as ``<s> w1 .. wk </s>``, written
as its tokens joined by single spaces. Included: every n-gram of the padded sentence except
the bare ``<s>`` unigram (``<s>`` is only ever a context, never predicted, as in ARPA models).
So ``</s>``, ``<s> w1``, ``wk </s>``, ``<s> w1 w2``, ``<s> w1 </s>`` (k = 1) are items.
Empty sentences produce no items. Items are enumerated in reading order of their last token,
shorter first; the per-report cap W keeps the first W distinct in-vocabulary items in this
order (see ``count_reports``).

Words and ``<unk>``: a vocabulary built with ``from_sentences`` has a closed word list (its
unigram items); every other word is read as ``<unk>``, in the public corpus as in reports, so
an n-gram with a rare word is counted as the same n-gram with ``<unk>`` ("the <unk> of") and the
``<unk>`` unigram carries the mass of all words outside the list. ``report_items`` extracts
every item of each report under that reading (what the curator stores and what DP n-gram
discovery looks at); ``count_reports`` counts only the vocabulary's items.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import repeat

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import scipy.sparse as sp

from lac.common.checks import check_int
from lac.common.files import atomic_file
from lac.common.text import BOS, EOS, UNK

__all__ = [
    "ngrams",
    "NgramVocabulary",
    "ReportCounts",
    "ReportItems",
    "count_reports",
    "user_counts",
    "cap_and_clamp",
    "report_items",
    "keyed_report_items",
]

_FORMAT_VERSION = 1


def ngrams(sentence: Sequence[str], max_n: int = 3) -> Iterator[str]:
    """All items of ``<s> sentence </s>`` for n = 1..max_n (see module docstring for the rule).

    Tokens must be non-empty, contain no whitespace and not be ``<s>``/``</s>`` themselves
    (``lac.common.text.words`` guarantees this); otherwise ValueError.
    """
    check_int(max_n, "max_n")
    toks = list(sentence)
    for t in toks:
        if not isinstance(t, str) or not t or t in (BOS, EOS) or len(t.split()) != 1 or t.strip() != t:
            raise ValueError(f"invalid token {t!r} in sentence")
    return _ngrams(toks, max_n)


def _ngrams(toks: list[str], max_n: int) -> Iterator[str]:
    if not toks:
        return
    padded = [BOS, *toks, EOS]
    for end in range(1, len(padded)):
        for n in range(1, min(max_n, end + 1) + 1):
            yield " ".join(padded[end - n + 1 : end + 1])


@dataclass(frozen=True)
class _Lookup:
    """Vectorised item lookup: an n-gram's id is built left to right through prefix tables."""

    wid: dict[str, int]  # in-sentence tokens -> word id (BOS/EOS deliberately absent)
    bos: int  # word id of <s>, -1 if no item uses it
    eos: int
    unk: int  # word id of <unk> (what words outside the vocabulary read as), -1 if it has none
    base: int  # number of word ids
    dense1: np.ndarray  # word id -> id of that 1-prefix (-1 if no item starts with the word)
    prefixes: tuple[_KeyTable, ...]  # [k-2] for k >= 2: the k-prefixes of items, keyed by
    # (id of the (k-1)-prefix) * base + word id; id = rank of the key among the k-prefixes
    columns: tuple[np.ndarray, ...]  # [k-1]: column of the item equal to that prefix, or -1


# ``NgramVocabulary.columns`` looks items up in a dict below len(vocabulary) / DICT_LOOKUP_FACTOR items,
# with a vectorised hash join above (a dict lookup costs about three item hashes of the join).
DICT_LOOKUP_FACTOR = 3


@dataclass(frozen=True, eq=False)
class NgramVocabulary:
    """The release vocabulary (public n-gram set) with its public counts ``alpha``."""

    items: tuple[str, ...]
    alpha: np.ndarray
    max_n: int
    _orders: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_int(self.max_n, "max_n")
        items = tuple(self.items)
        alpha = np.array(self.alpha, dtype=np.float64, copy=True).reshape(-1)
        if alpha.shape != (len(items),):
            raise ValueError(f"alpha has {alpha.size} entries for {len(items)} items")
        if not np.all(np.isfinite(alpha)) or np.any(alpha < 0):
            raise ValueError("alpha must be finite and >= 0")
        orders = np.empty(len(items), dtype=np.int8)
        for i, it in enumerate(items):
            if not isinstance(it, str):
                raise ValueError(f"item {i} is not a string: {it!r}")
            parts = it.split(" ")
            if not 1 <= len(parts) <= self.max_n or any(not p or p != p.strip() or len(p.split()) != 1 for p in parts):
                raise ValueError(f"item {it!r} is not an n-gram of 1..{self.max_n} single-space-separated tokens")
            orders[i] = len(parts)
        if len(set(items)) != len(items):
            raise ValueError("items contain duplicates")
        alpha.setflags(write=False)
        orders.setflags(write=False)
        object.__setattr__(self, "items", items)
        object.__setattr__(self, "alpha", alpha)
        object.__setattr__(self, "max_n", int(self.max_n))
        object.__setattr__(self, "_orders", orders)

    def __len__(self) -> int:
        return len(self.items)

    def __getstate__(self) -> dict[str, object]:
        # Without the cached lookups (index, words, Arrow items): they more than double the pickle a Spark
        # job carries, and are rebuilt where needed.
        return {k: self.__dict__[k] for k in ("items", "alpha", "max_n", "_orders")}

    @cached_property
    def words(self) -> frozenset[str]:
        """The vocabulary's word list: its unigram items other than ``</s>`` and ``<unk>``."""
        return frozenset(it for it, o in zip(self.items, self._orders.tolist()) if o == 1) - {EOS, UNK}

    @property
    def has_unk(self) -> bool:
        """True if words outside ``words`` are read as ``<unk>`` (the vocabulary has a ``<unk>`` unigram)."""
        return UNK in self.index

    @property
    def orders(self) -> np.ndarray:
        """int8 array: n of each item."""
        return self._orders

    def order(self, item: str) -> int:
        return int(self._orders[self.index[item]])

    @cached_property
    def index(self) -> dict[str, int]:
        """item -> column."""
        return {it: i for i, it in enumerate(self.items)}

    @cached_property
    def _arrow_items(self) -> pa.Array:
        return pa.array(self.items, pa.string())

    def columns(self, items: Sequence[str] | pa.Array) -> np.ndarray:
        """int64 column of each of ``items`` (str, or Arrow strings), -1 for those outside the vocabulary."""
        if DICT_LOOKUP_FACTOR * len(items) < len(self.items):  # few items: cheaper than hashing every item
            index = self.index
            names = items.to_pylist() if isinstance(items, pa.Array) else items
            return np.fromiter((index.get(it, -1) for it in names), dtype=np.int64, count=len(items))
        found = pc.index_in(item_array(items), value_set=self._arrow_items)
        return found.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)

    @classmethod
    def from_sentences(
        cls,
        sentences: Iterable[Sequence[str]],
        max_n: int = 3,
        min_count: int = 1,
        max_items: int | None = None,
        unknown_words: bool = False,
    ) -> NgramVocabulary:
        """Public counts from a *public* corpus: items with count >= min_count, most frequent
        first (ties by item text), at most ``max_items``.

        With ``unknown_words`` the word list is closed first: words seen fewer than ``min_count``
        times are read as ``<unk>``; then every unigram (the whole word list, ``</s>`` and
        ``<unk>``) is kept and ``max_items`` caps the total with the most frequent longer items.
        """
        check_int(max_n, "max_n")
        check_int(min_count, "min_count")
        if max_items is not None:
            check_int(max_items, "max_items", minimum=0)
        sentences = [list(s) for s in sentences] if unknown_words else sentences
        if unknown_words:
            words = Counter(w for s in sentences for w in s)
            rare = {w for w, c in words.items() if c < min_count}
            sentences = [[UNK if w in rare else w for w in s] for s in sentences]
        counts: Counter[str] = Counter()
        for s in sentences:
            counts.update(_ngrams(list(s), max_n) if unknown_words else ngrams(s, max_n))
        kept = sorted(
            ((c, it) for it, c in counts.items() if c >= min_count or (unknown_words and " " not in it)),
            key=lambda p: (-p[0], p[1]),
        )
        if unknown_words:
            uni = [p for p in kept if " " not in p[1]]
            longer = [p for p in kept if " " in p[1]]
            room = None if max_items is None else max(max_items - len(uni), 0)
            kept = uni + (longer if room is None else longer[:room])
        elif max_items is not None:
            kept = kept[:max_items]
        return cls(tuple(it for _, it in kept), np.array([c for c, _ in kept], dtype=np.float64), max_n)

    def save(self, path: str | os.PathLike) -> None:
        """Write exactly ``path`` (an .npz: UTF-8 items joined by newlines, alpha, max_n), atomically."""
        for it in self.items:
            if "\n" in it:
                raise ValueError(f"item {it!r} contains a newline and cannot be saved")
        blob = np.frombuffer("\n".join(self.items).encode("utf-8"), dtype=np.uint8)
        with atomic_file(path) as f:
            np.savez_compressed(
                f,
                format=np.int64(_FORMAT_VERSION),
                items=blob,
                n_items=np.int64(len(self.items)),
                alpha=self.alpha,
                max_n=np.int64(self.max_n),
            )

    @classmethod
    def load(cls, path: str | os.PathLike) -> NgramVocabulary:
        with np.load(os.fspath(path), allow_pickle=False) as z:
            if int(z["format"]) != _FORMAT_VERSION:
                raise ValueError(f"unsupported vocabulary format {int(z['format'])}")
            n = int(z["n_items"])
            text = z["items"].tobytes().decode("utf-8")
            items = tuple(text.split("\n")) if n else ()
            if len(items) != n:
                raise ValueError(f"corrupt vocabulary file: {len(items)} items, header says {n}")
            return cls(items, z["alpha"], int(z["max_n"]))

    @cached_property
    def lookup(self) -> _Lookup:
        """The vocabulary's n-grams as integer keys over its tokens (built once), what ``report_counts`` reads."""
        parts = [it.split(" ") for it in self.items]
        tokens = sorted({t for p in parts for t in p})
        all_ids = {t: i for i, t in enumerate(tokens)}
        base = max(len(tokens), 1)
        n_items = len(parts)
        if n_items * base >= 1 << 62:
            raise ValueError("vocabulary too large for 64-bit n-gram keys")
        wids = np.full((n_items, self.max_n), -1, dtype=np.int64)
        for i, p in enumerate(parts):
            wids[i, : len(p)] = [all_ids[t] for t in p]
        lengths = self._orders.astype(np.int64)
        prefixes, columns = [], []
        pid = np.zeros(n_items, dtype=np.int64)
        for k in range(1, self.max_n + 1):
            has = lengths >= k
            keys = wids[has, k - 1] if k == 1 else pid[has] * base + wids[has, k - 1]
            table, inv = np.unique(keys, return_inverse=True)
            pid = np.full(n_items, -1, dtype=np.int64)
            pid[has] = inv
            col = np.full(table.size, -1, dtype=np.int64)
            exact = np.flatnonzero(lengths == k)
            col[pid[exact]] = exact
            prefixes.append(table)
            columns.append(col)
        dense1 = np.full(base, -1, dtype=np.int64)
        dense1[prefixes[0]] = np.arange(prefixes[0].size)
        wid = dict(all_ids)
        bos, eos = wid.pop(BOS, -1), wid.pop(EOS, -1)
        tables = tuple(_KeyTable(t) for t in prefixes[1:])
        return _Lookup(wid, bos, eos, wid.get(UNK, -1), base, dense1, tables, tuple(columns))


@dataclass(frozen=True)
class ReportCounts:
    """Result of ``count_reports``; ``matrix`` has one row per report, in input order."""

    matrix: sp.csr_matrix
    n_ngrams: int  # n-grams extracted (exactly what ``ngrams`` yields over all sentences)
    n_out_of_vocab: int  # of those, occurrences not in the public vocabulary (dropped)
    n_over_cap: int  # distinct in-vocabulary items dropped by the per-report cap W
    n_clamped: int  # occurrences removed by clamping per-item counts at C (kept items only)


class _KeyTable:
    """Static int64 key -> rank-in-sorted-order map, probed vectorised (a hash table laid out
    as hash-sorted buckets: a few cache-friendly gathers instead of a binary search)."""

    _MULT = np.uint64(0x9E3779B97F4A7C15)

    def __init__(self, sorted_keys: np.ndarray) -> None:
        m = sorted_keys.size
        self.bits = max(1, int(2 * m - 1).bit_length()) if m else 1
        h = self._hash(sorted_keys)
        order = np.argsort(h, kind="stable")
        self.keys = sorted_keys[order]
        self.ranks = order.astype(np.int64)
        self.offsets = np.searchsorted(h[order], np.arange((1 << self.bits) + 1, dtype=np.uint64))
        self.max_probe = int(np.diff(self.offsets).max()) if m else 0

    def _hash(self, keys: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            return (keys.astype(np.uint64) * self._MULT) >> np.uint64(64 - self.bits)

    def find(self, q: np.ndarray) -> np.ndarray:
        """Rank of each key in the sorted key set, -1 where absent."""
        out = np.full(q.size, -1, dtype=np.int64)
        if self.max_probe == 0 or q.size == 0:
            return out
        hq = self._hash(q).astype(np.int64)
        pos = self.offsets[hq]
        end = self.offsets[hq + 1]
        todo = np.flatnonzero(pos < end)
        pos, end = pos[todo], end[todo]
        for _ in range(self.max_probe):
            if todo.size == 0:
                break
            hit = self.keys[pos] == q[todo]
            out[todo[hit]] = self.ranks[pos[hit]]
            pos += 1
            more = ~hit & (pos < end)
            todo, pos, end = todo[more], pos[more], end[more]
        return out


def _count_chunk(reports: list, vocab: NgramVocabulary, lk: _Lookup, C: int | None, W: int | None):
    n_rep = len(reports)
    V = len(vocab)
    max_n = vocab.max_n
    sents = [s for rep in reports for s in rep]
    if any(isinstance(s, str) for s in sents):
        raise TypeError("a report is a sequence of sentences, each a sequence of tokens, not a string")
    slen = np.fromiter(map(len, sents), dtype=np.int64, count=len(sents))
    rep_of_sent = np.repeat(np.arange(n_rep, dtype=np.int64), [len(rep) for rep in reports])
    keep = slen > 0
    slen, rep_of_sent = slen[keep], rep_of_sent[keep]
    flat = [t for s in sents for t in s]
    if not flat:
        return np.zeros(n_rep, np.int64), np.empty(0, np.int32), np.empty(0, np.int32), 0, 0, 0, 0
    tok = np.fromiter(map(lk.wid.get, flat, repeat(lk.unk)), dtype=np.int64, count=len(flat))
    # Padded layout: <s> w1 .. wk </s> per sentence, sentences of a report consecutive.
    lens = slen + 2
    starts = np.cumsum(lens) - lens
    wid = np.empty(int(lens.sum()), dtype=np.int64)
    wid[starts] = lk.bos
    wid[starts + lens - 1] = lk.eos
    wid[np.arange(tok.size) + np.repeat(starts + 1 - (np.cumsum(slen) - slen), slen)] = tok
    pos_in_sent = np.arange(wid.size, dtype=np.int64) - np.repeat(starts, lens)
    rep_of_pos = np.repeat(rep_of_sent, lens)

    n_ngrams = 0
    # col_at[p*max_n + k-1] = column of the k-gram ending at padded position p, else -1: this
    # layout is the enumeration order of ``ngrams``, so no sort by occurrence is needed later.
    col_at = np.full(wid.size * max_n, -1, dtype=np.int64)
    pid = np.full(wid.size, -1, dtype=np.int64)
    for k in range(1, max_n + 1):
        n_ngrams += int(np.maximum(lens - k + 1, 0).sum()) - (lens.size if k == 1 else 0)
        if k == 1:
            cand = np.flatnonzero(wid >= 0)
            keys = wid[cand]
        else:
            prev = np.full(wid.size, -1, dtype=np.int64)
            prev[1:] = pid[:-1]
            cand = np.flatnonzero((prev >= 0) & (wid >= 0) & (pos_in_sent >= k - 1))
            keys = prev[cand] * lk.base + wid[cand]
        pid = np.full(wid.size, -1, dtype=np.int64)
        pid[cand] = lk.dense1[keys] if k == 1 else lk.prefixes[k - 2].find(keys)
        found = cand[pid[cand] >= 0]
        col = lk.columns[k - 1][pid[found]]
        hit = col >= 0
        if k == 1:
            hit &= pos_in_sent[found] > 0  # the bare <s> unigram is never an item
        col_at[found[hit] * max_n + (k - 1)] = col[hit]
    o = np.flatnonzero(col_at >= 0)
    c = col_at[o]
    r = rep_of_pos[o // max_n]
    del col_at
    n_oov = n_ngrams - o.size
    Vk = max(V, 1)
    key = r * Vk + c
    order = np.argsort(key, kind="stable")  # stable: each group starts at its first occurrence
    key, o = key[order], o[order]
    first = np.ones(key.size, dtype=bool)
    first[1:] = key[1:] != key[:-1]
    gstart = np.flatnonzero(first)
    gcount = np.diff(np.append(gstart, key.size))
    gkey, gfirst = key[gstart], o[gstart]
    grow = gkey // Vk
    gcol = gkey - grow * Vk
    if C is None:  # raw: each report's items in first-occurrence order, counts not clamped
        by_occ = np.argsort(gfirst, kind="stable")
        row_nnz = np.bincount(grow, minlength=n_rep)
        return row_nnz, gcol[by_occ].astype(np.int32), gcount[by_occ].astype(np.int32), n_ngrams, n_oov, 0, 0
    n_over_cap = 0
    if W is not None:
        # Occurrence ordinals grow with the report index, so sorting by them alone orders the
        # groups by (report, first occurrence).
        by_occ = np.argsort(gfirst, kind="stable")
        per_row = np.bincount(grow, minlength=n_rep)
        row_start = np.cumsum(per_row) - per_row
        rank = np.empty(gkey.size, dtype=np.int64)
        rank[by_occ] = np.arange(gkey.size) - row_start[grow[by_occ]]
        kept = rank < W
        n_over_cap = int(gkey.size - kept.sum())
        grow, gcol, gcount = grow[kept], gcol[kept], gcount[kept]
    n_clamped = int(np.maximum(gcount - C, 0).sum())
    row_nnz = np.bincount(grow, minlength=n_rep)
    clamped = np.minimum(gcount, C).astype(np.int32)
    return row_nnz, gcol.astype(np.int32), clamped, n_ngrams, n_oov, n_over_cap, n_clamped


def count_reports(
    reports: Iterable[Sequence[Sequence[str]]],
    vocab: NgramVocabulary,
    C: int | None,
    W: int | None,
    chunk_size: int = 32768,
) -> ReportCounts:
    """Per-report counts over ``vocab`` columns (one row per report = one anonymous user).

    Per report: extract ``ngrams`` of each sentence; drop n-grams not in ``vocab``; if W is
    set keep only the first W distinct remaining items in enumeration order (reading order of
    the item's last token, shorter first — a rule that looks at this report alone, so the
    bound holds whatever other users send); clamp each kept item's count at C. Tokens equal to
    ``<s>``/``</s>`` inside a sentence are treated as out-of-vocabulary words.

    With ``C=None`` (raw, W must be None): no cap, no clamp, and each row lists the report's
    items in first-occurrence order (indices not sorted) with their full counts: what the
    curator stores, so ``cap_and_clamp`` can apply any W and C later.
    """
    if C is None and W is not None:
        raise ValueError("raw counts (C=None) take no W")
    if C is not None:
        check_int(C, "C")
    if W is not None:
        check_int(W, "W")
    check_int(chunk_size, "chunk_size")
    lk = vocab.lookup
    nnz_parts, col_parts, data_parts = [], [], []
    totals = np.zeros(4, dtype=np.int64)
    chunk: list = []

    def flush() -> None:
        row_nnz, cols, data, *stats = _count_chunk(
            chunk, vocab, lk, None if C is None else int(C), None if W is None else int(W)
        )
        nnz_parts.append(row_nnz)
        col_parts.append(cols)
        data_parts.append(data)
        totals[:] += stats
        chunk.clear()

    for rep in reports:
        chunk.append(rep)
        if len(chunk) >= chunk_size:
            flush()
    if chunk:
        flush()
    row_nnz = np.concatenate(nnz_parts) if nnz_parts else np.zeros(0, np.int64)
    indptr = np.zeros(row_nnz.size + 1, dtype=np.int64)
    np.cumsum(row_nnz, out=indptr[1:])
    indices = np.concatenate(col_parts) if col_parts else np.empty(0, np.int32)
    data = np.concatenate(data_parts) if data_parts else np.empty(0, np.int32)
    if indptr[-1] <= np.iinfo(np.int32).max:
        indptr = indptr.astype(np.int32)
    matrix = sp.csr_matrix((data, indices, indptr), shape=(row_nnz.size, len(vocab)))
    if C is not None:
        matrix.has_sorted_indices = True
        matrix.has_canonical_format = True
    n_ngrams, n_oov, n_cap, n_clamped = (int(x) for x in totals)
    return ReportCounts(matrix, n_ngrams, n_oov, n_cap, n_clamped)


def user_counts(
    reports: Iterable[Sequence[Sequence[str]]], vocab: NgramVocabulary, C: int, W: int | None
) -> sp.csr_matrix:
    """int32 CSR of per-report counts; see ``count_reports`` for the rule and drop statistics."""
    return count_reports(reports, vocab, C, W).matrix


def cap_and_clamp(
    indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, n_cols: int, C: int, W: int | None
) -> sp.csr_matrix:
    """Canonical int32 CSR from raw rows in first-occurrence order (``count_reports(C=None)``,
    columns < 0 dropped first; a row's columns must be distinct): keep each row's first W entries,
    clamp counts at C. Equals ``user_counts`` of the same reports over the same columns."""
    indptr = np.asarray(indptr, dtype=np.int64)
    indices = np.asarray(indices, dtype=np.int64)
    n = indptr.size - 1
    row = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    keep = indices >= 0
    row, indices, data = row[keep], indices[keep], np.asarray(data)[keep]
    if W is not None:
        row_nnz = np.bincount(row, minlength=n)
        start = np.cumsum(row_nnz) - row_nnz
        rank = np.arange(row.size, dtype=np.int64) - start[row]
        kept = rank < W
        row, indices, data = row[kept], indices[kept], data[kept]
    row_nnz = np.bincount(row, minlength=n)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(row_nnz, out=indptr[1:])
    if indptr[-1] <= np.iinfo(np.int32).max:
        indptr = indptr.astype(np.int32)
    # A row's columns are distinct (distinct items), so sorting them makes the matrix canonical.
    m = sp.csr_matrix((np.minimum(data, C).astype(np.int32), indices.astype(np.int32), indptr), shape=(n, n_cols))
    m.sort_indices()
    m.has_canonical_format = True
    return m


@dataclass(frozen=True, eq=False)
class ReportItems:
    """Every distinct item of each report, in first-occurrence order, with raw counts.

    ``item_ids`` index ``items`` (a dictionary local to these reports); row r is
    ``item_ids[indptr[r]:indptr[r+1]]``. Words outside ``words`` were read as ``<unk>``.
    ``texts`` (None: not kept) is each report's words in order, its sentences concatenated, as the
    report had them (a pyarrow list<string> array, one entry per report): what an export reads.
    """

    indptr: np.ndarray  # int64, n_reports + 1
    item_ids: np.ndarray  # int32
    counts: np.ndarray  # int32, raw (no cap, no clamp)
    items: tuple[str, ...] | pa.Array  # Arrow strings as segments and ingest hold them (``item_array``/``item_names``)
    texts: pa.ListArray | None = None

    @property
    def n_reports(self) -> int:
        return self.indptr.size - 1


def item_array(items: Sequence[str] | pa.Array) -> pa.Array:
    """``ReportItems.items`` as an Arrow string array (the same object when it is one)."""
    return items if isinstance(items, pa.Array) else pa.array(items, pa.string())


def item_names(items: Sequence[str] | pa.Array) -> tuple[str, ...]:
    """``ReportItems.items`` as a tuple of ``str``."""
    return tuple(items.to_pylist()) if isinstance(items, pa.Array) else tuple(items)


def spell(words: pa.Array, codes: np.ndarray) -> pa.Array:
    """Items spelled from word codes: item i is ``words[codes[i, j]]`` over j joined by spaces, negative codes
    skipped (an Arrow string array)."""
    columns = [words.take(pa.array(codes[:, j], mask=codes[:, j] < 0)) for j in range(codes.shape[1])]
    if not columns or not codes.shape[0]:
        return pa.array([], pa.string())
    return pc.binary_join_element_wise(*columns, " ", null_handling="skip")


def report_items(
    reports: Sequence[Sequence[Sequence[str]]], max_n: int = 3, words: frozenset[str] | None = None
) -> ReportItems:
    """All items (as ``ngrams`` enumerates them) of each report, distinct per report in order of
    first occurrence, with their counts. With ``words``, any other token is read as ``<unk>``.

    Vectorised: tokens get integer ids (1..B−1; ``<s>`` = 1, ``</s>`` = 2, then the words in order
    of first occurrence), an n-gram of ids (i₁..iₙ) gets the key Σ i_k·B^(n−k), distinct across
    orders because ids are never 0; only the distinct keys of the batch are turned back into
    strings, and ``items`` is in key order.
    """
    return keyed_report_items(reports, max_n, words)[0]


def keyed_report_items(
    reports: Sequence[Sequence[Sequence[str]]], max_n: int = 3, words: frozenset[str] | None = None, spell: bool = True
) -> tuple[ReportItems, np.ndarray, int, tuple[str, ...]]:
    """``report_items`` with the items' keys (int64, increasing, one per item), the base B of the
    keys and the word of each id (``""`` for 0): what ``lac.curator.ingest.chunks`` needs to merge the
    counts of several chunks of reports into those of all of them. ``spell=False`` leaves
    ``items`` empty (the caller spells the keys)."""
    check_int(max_n, "max_n")
    n_rep = len(reports)
    sents = [s for rep in reports for s in rep]
    slen = np.fromiter(map(len, sents), dtype=np.int64, count=len(sents))
    rep_of_sent = np.repeat(np.arange(n_rep, dtype=np.int64), [len(rep) for rep in reports])
    keep = slen > 0
    slen, rep_of_sent = slen[keep], rep_of_sent[keep]
    flat = [t for s in sents for t in s]
    n_words = np.bincount(rep_of_sent, weights=slen, minlength=n_rep).astype(np.int64)
    offsets = np.zeros(n_rep + 1, dtype=np.int32)
    np.cumsum(n_words, out=offsets[1:])
    texts = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat, pa.string()))
    if not flat:
        return (
            ReportItems(np.zeros(n_rep + 1, np.int64), np.empty(0, np.int32), np.empty(0, np.int32), (), texts),
            np.empty(0, np.int64),
            3,
            ("", BOS, EOS),
        )
    vocab_words: dict[str, int] = {BOS: 1, EOS: 2}
    if words is not None:
        vocab_words[UNK] = 3
        mapped = [t if t in words else UNK for t in flat]
    else:
        mapped = flat
    for t in mapped:
        if t not in vocab_words:
            vocab_words[t] = len(vocab_words) + 1
    B = len(vocab_words) + 1
    if B**max_n >= 1 << 62:
        raise ValueError(f"{B - 1} distinct words are too many for 64-bit {max_n}-gram keys")
    tok = np.fromiter(map(vocab_words.__getitem__, mapped), dtype=np.int64, count=len(mapped))
    lens = slen + 2
    starts = np.cumsum(lens) - lens
    wid = np.empty(int(lens.sum()), dtype=np.int64)
    wid[starts] = 1
    wid[starts + lens - 1] = 2
    wid[np.arange(tok.size) + np.repeat(starts + 1 - (np.cumsum(slen) - slen), slen)] = tok
    pos_in_sent = np.arange(wid.size, dtype=np.int64) - np.repeat(starts, lens)
    rep_of_pos = np.repeat(rep_of_sent, lens)
    # every n-gram's key, laid out [position, order - 1]: flattened row-major, entry i is ordinal i of ``ngrams``
    all_keys = np.zeros((wid.size, max_n), dtype=np.int64)
    valid = np.zeros((wid.size, max_n), dtype=bool)
    key = np.zeros(wid.size, dtype=np.int64)
    for k in range(1, max_n + 1):
        if k == 1:
            key = wid.copy()
            valid[:, 0] = pos_in_sent > 0  # the bare <s> unigram is never an item
        else:
            prev = np.zeros(wid.size, dtype=np.int64)
            prev[1:] = key[:-1]
            key = prev * B + wid
            valid[:, k - 1] = pos_in_sent >= k - 1
        all_keys[:, k - 1] = key
    ordinal = np.flatnonzero(valid.ravel())
    key = all_keys.ravel()[ordinal]
    rep = rep_of_pos[ordinal // max_n]
    uniq, inverse = np.unique(key, return_inverse=True)  # items in key order; inverse: each n-gram's item id
    inverse = inverse.reshape(-1)
    pair = rep * uniq.size + inverse  # (report, item) as one int64; ordinals grow with the report
    order = np.argsort(pair, kind="stable")  # by report, then item, then first occurrence
    pair = pair[order]
    first = np.ones(pair.size, dtype=bool)
    first[1:] = pair[1:] != pair[:-1]
    gstart = np.flatnonzero(first)
    gcount = np.diff(np.append(gstart, pair.size))
    by_occurrence = np.argsort(ordinal[order][gstart])  # a report's items by first occurrence, reports in order
    item_ids = inverse[order][gstart][by_occurrence]
    gcount, grep = gcount[by_occurrence], rep[order][gstart][by_occurrence]
    names = ["", *vocab_words]  # id -> word (ids start at 1)
    items = []
    for k in uniq.tolist() if spell else ():
        parts = []
        while k:
            k, i = divmod(k, B)
            parts.append(names[i])
        items.append(" ".join(reversed(parts)))
    indptr = np.zeros(n_rep + 1, dtype=np.int64)
    np.cumsum(np.bincount(grep, minlength=n_rep), out=indptr[1:])
    return (
        ReportItems(indptr, item_ids.astype(np.int32).reshape(-1), gcount.astype(np.int32), tuple(items), texts),
        uniq,
        B,
        tuple(names),
    )
