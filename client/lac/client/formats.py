"""Readers for the standard word-vector formats users bring, returning ``Embedding``.

Supported formats (``fmt``):

* ``"glove"`` -- GloVe text: one ``word v1 ... vd`` line per word, no header.
* ``"word2vec-text"`` / ``"fasttext-vec"`` -- a header line ``V d`` then GloVe-style lines
  (fastText's ``.vec`` files are exactly word2vec text).
* ``"word2vec-bin"`` -- the word2vec C binary format: header ``V d\\n`` then, per word, the
  word's bytes, one space, and ``d`` little-endian float32 values (an optional newline
  before the next word is skipped, as the original tool writes it).
* ``"auto"`` -- by extension (``.bin`` -> binary) and otherwise by the first line
  (two integers -> word2vec text header, else GloVe).

These files list words most frequent first, so ``vocab_size`` keeps the first rows.
Nothing is normalised or re-ordered: vectors are kept exactly as stored (text values are
parsed in float64 and rounded once to float32).  Words are split off at the *last* ``d``
values of a line, so words containing spaces (GloVe 840B) survive.  A word repeated later
in a file is skipped (the first, most frequent row wins) and counted in ``source``.

``load_vectors`` converts a file once into the project's cached format
(``embedding.save``) and loads it as a read-only memory map, so large matrices are not held
in private memory by each process.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from lac.client.embedding import Embedding, StrPath, cache_root, cached, load
from lac.common.checks import check_int

FORMATS = ("glove", "word2vec-text", "fasttext-vec", "word2vec-bin")
_TEXT_CHUNK = 8192  # lines parsed per numpy conversion


class EmbeddingFormatError(ValueError):
    """The file is not a well-formed file of the stated format."""


def _check_vocab_size(vocab_size: Any) -> int | None:
    if vocab_size is None:
        return None
    return check_int(vocab_size, "vocab_size (or None)")


def _parse_header(line: str) -> tuple[int, int] | None:
    parts = line.split()
    if len(parts) == 2 and all(p.isdigit() for p in parts):
        return int(parts[0]), int(parts[1])
    return None


def detect_format(path: StrPath) -> str:
    """Guess the format of ``path`` (see the module docstring)."""
    path = Path(path)
    if path.suffix.lower() == ".bin":
        return "word2vec-bin"
    with open(path, "rb") as f:
        first = f.readline(1 << 16)
    try:
        first_text = first.decode("utf-8")
    except UnicodeDecodeError:
        return "word2vec-bin"
    if _parse_header(first_text) is not None:
        return "fasttext-vec" if path.suffix.lower() == ".vec" else "word2vec-text"
    return "glove"


class _Collector:
    """Accumulates (word, row) pairs, skipping duplicate words and stopping at ``limit``."""

    def __init__(self, limit: int | None, dim: int) -> None:
        self.limit, self.dim = limit, dim
        self.words: list[str] = []
        self.seen: set[str] = set()
        self.blocks: list[np.ndarray] = []
        self.duplicates = 0

    @property
    def full(self) -> bool:
        """``limit`` words collected."""
        return self.limit is not None and len(self.words) >= self.limit

    def add_block(self, words: list[str], rows: np.ndarray) -> None:
        """Keep the new words of ``words`` (up to ``limit``) with their rows."""
        keep = []
        for i, w in enumerate(words):
            if self.full or (self.limit is not None and len(self.words) >= self.limit):
                break
            if w in self.seen:
                self.duplicates += 1
                continue
            self.seen.add(w)
            self.words.append(w)
            keep.append(i)
        if keep:
            self.blocks.append(rows[np.asarray(keep)] if len(keep) != len(rows) else rows)

    def matrix(self) -> np.ndarray:
        """The kept rows as one contiguous float32 matrix."""
        if not self.blocks:
            raise EmbeddingFormatError("no vectors found")
        return np.ascontiguousarray(np.concatenate(self.blocks, axis=0), dtype=np.float32)


def _read_text(path: Path, has_header: bool, limit: int | None, encoding: str, errors: str) -> _Collector:
    header = None
    col: _Collector | None = None
    with open(path, encoding=encoding, errors=errors, newline="\n") as f:
        if has_header:
            header = _parse_header(f.readline())
            if header is None:
                raise EmbeddingFormatError(f"{path}: first line is not a 'V d' header")
            col = _Collector(limit, header[1])
        lineno = 1 if has_header else 0
        words: list[str] = []
        values: list[list[str]] = []

        def flush() -> None:
            if not words or col is None:  # col is set before the first word
                return
            try:
                rows = np.array(values, dtype=np.float64).astype(np.float32)
            except ValueError as e:
                raise EmbeddingFormatError(f"{path}: non-numeric vector value near line {lineno}: {e}") from None
            col.add_block(list(words), rows)
            words.clear()
            values.clear()

        for line in f:
            lineno += 1
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            if col is None:  # GloVe: dimension from the first line (last tokens that parse as numbers)
                toks = line.rstrip(" ").split(" ")
                dim = 0
                for t in reversed(toks[1:]):
                    try:
                        float(t)
                    except ValueError:
                        break
                    dim += 1
                if dim == 0:
                    raise EmbeddingFormatError(f"{path}: line 1 has no vector values")
                col = _Collector(limit, dim)
            parts = line.rstrip(" ").rsplit(" ", col.dim)
            if len(parts) != col.dim + 1 or not parts[0].strip():
                raise EmbeddingFormatError(f"{path}: line {lineno} does not hold a word and {col.dim} values")
            words.append(parts[0].strip(" "))
            values.append(parts[1:])
            if len(words) >= _TEXT_CHUNK:
                flush()
                if col.full:
                    break
        flush()
    if col is None:  # GloVe text without a single non-blank line
        raise EmbeddingFormatError(f"{path}: no vectors found")
    if header is not None and limit is None and len(col.words) + col.duplicates != header[0]:
        raise EmbeddingFormatError(
            f"{path}: header announces {header[0]} words, file holds {len(col.words) + col.duplicates}"
        )
    return col


def _read_bin(path: Path, limit: int | None, encoding: str, errors: str) -> _Collector:
    with open(path, "rb") as f:
        header = _parse_header(f.readline().decode("ascii", errors="replace"))
        if header is None:
            raise EmbeddingFormatError(f"{path}: first line is not a 'V d' header")
        size, dim = header
        col = _Collector(limit, dim)
        nbytes = 4 * dim
        data = f.read()  # files in this format are read whole; see load_vectors for caching
    pos, n = 0, 0
    words: list[str] = []
    rows: list[np.ndarray] = []
    while n < size and not col.full:
        while pos < len(data) and data[pos : pos + 1] in (b"\n", b"\r"):
            pos += 1
        end = data.find(b" ", pos)
        if end < 0 or end + 1 + nbytes > len(data):
            raise EmbeddingFormatError(f"{path}: truncated at word {n} of {size}")
        word = data[pos:end].decode(encoding, errors=errors)
        if not word or "\n" in word or "\r" in word:
            raise EmbeddingFormatError(f"{path}: invalid word {word!r} at entry {n}")
        words.append(word)
        rows.append(np.frombuffer(data, dtype="<f4", count=dim, offset=end + 1))
        pos = end + 1 + nbytes
        n += 1
        if len(words) >= _TEXT_CHUNK:
            col.add_block(words, np.stack(rows).astype(np.float32))
            words, rows = [], []
    if words:
        col.add_block(words, np.stack(rows).astype(np.float32))
    if n < size and not col.full:
        raise EmbeddingFormatError(f"{path}: header announces {size} words, file holds {n}")
    return col


def read_vectors(
    path: StrPath,
    fmt: str = "auto",
    vocab_size: int | None = None,
    *,
    name: str | None = None,
    encoding: str = "utf-8",
    errors: str = "strict",
) -> Embedding:
    """Read ``path`` into an in-memory ``Embedding`` (first ``vocab_size`` distinct words)."""
    path = Path(path)
    limit = _check_vocab_size(vocab_size)
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; one of {FORMATS + ('auto',)}")
    if fmt == "word2vec-bin":
        col = _read_bin(path, limit, encoding, errors)
    else:
        col = _read_text(path, fmt != "glove", limit, encoding, errors)
    if limit is not None and len(col.words) < limit:
        raise ValueError(f"{path} holds only {len(col.words)} distinct words, {limit} requested")
    vectors = col.matrix()
    dup = f"; {col.duplicates} repeated words skipped (first occurrence kept)" if col.duplicates else ""
    return Embedding(
        name=name or f"{path.name}/{len(col.words)}",
        words=tuple(col.words),
        vectors=vectors,
        source=f"{fmt} file {path.name}; first {len(col.words)} distinct words in file order, "
        f"values as stored (not normalised){dup}",
    )


def _file_key(path: Path) -> str:
    st = path.stat()
    h = hashlib.sha256(f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()
    return h[:16]


def load_vectors(
    path: StrPath,
    fmt: str = "auto",
    vocab_size: int | None = None,
    *,
    cache_dir: StrPath | None = None,
    name: str | None = None,
    encoding: str = "utf-8",
    errors: str = "strict",
) -> Embedding:
    """Like ``read_vectors`` but converted once into ``<cache_dir>/imported/<key>/<vocab_size>/``.

    ``cache_dir`` defaults to ``data_dir()/"embeddings"``; the key covers the file's resolved
    path, size and modification time, so an edited file is converted again.  The returned
    vectors are a read-only memmap of the cached ``vectors.npy``; the exact diameter is
    computed once and stored with it.
    """
    path = Path(path)
    limit = _check_vocab_size(vocab_size)
    target = cache_root(cache_dir) / "imported" / f"{path.stem}-{_file_key(path)}" / (str(limit) if limit else "all")
    return cached(target, lambda: read_vectors(path, fmt, limit, name=name, encoding=encoding, errors=errors))


def open_embedding(spec: str, vocab_size: int | None = 50_000, *, cache_dir: StrPath | None = None) -> Embedding:
    """``"default"`` (GloVe 6B 50d), a cached embedding directory, or a vector file."""
    from lac.client.embedding import glove_default

    if spec in ("default", "glove", ""):
        return glove_default(vocab_size or 50_000, cache_dir=cache_dir)
    p = Path(spec)
    if p.is_dir():
        emb = load(p)
        if vocab_size is None or vocab_size >= emb.size:
            return emb
        _check_vocab_size(vocab_size)
        # Rows are assumed to be in frequency order (as every supported format stores them).
        return Embedding(
            f"{emb.name}[:{vocab_size}]",
            emb.words[:vocab_size],
            emb.vectors[:vocab_size],
            source=f"{emb.source}; first {vocab_size} rows",
            license=emb.license,
        )
    return load_vectors(p, vocab_size=vocab_size, cache_dir=cache_dir)
