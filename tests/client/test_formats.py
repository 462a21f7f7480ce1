"""Readers for GloVe / word2vec / fastText files, on the real small files shipped in gensim's wheel.

gensim is located with ``importlib.util.find_spec`` and never imported.
"""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import numpy as np
import pytest

from lac.client import formats
from lac.client.embedding import Embedding


def _gensim_data() -> Path | None:
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0]) / "test" / "test_data"
    return d if d.is_dir() else None


DATA = _gensim_data()
pytestmark = pytest.mark.skipif(DATA is None, reason="gensim wheel (its test data files) not installed")

W2V_TEXT = "EN.1-10.cbow1_wind5_hs0_neg10_size300_smpl1e-05.txt"

# file, detected format, size, dim, first words
CASES = [
    ("lee_fasttext.vec", "fasttext-vec", 1762, 10, ("the", "to", "of")),
    ("euclidean_vectors.bin", "word2vec-bin", 2747, 10, ("the", "to", "of")),
    ("test_glove.txt", "glove", 76, 50, ("the",)),
    (W2V_TEXT, "word2vec-text", 20, 300, ("one", "two", "three")),
    ("high_precision.kv.bin", "word2vec-bin", 2, 2, ("kangaroo.n.01", "horse.n.01")),
]


@pytest.mark.parametrize("fname,fmt,size,dim,first", CASES)
def test_real_files(fname, fmt, size, dim, first):
    path = DATA / fname
    assert formats.detect_format(path) == fmt
    emb = formats.read_vectors(path)
    assert isinstance(emb, Embedding)
    assert (emb.size, emb.dim) == (size, dim)
    assert emb.words[: len(first)] == first
    assert emb.vectors.dtype == np.float32
    assert emb.diameter() > 0


def _text_row(path: Path, lineno: int, header: bool):
    line = path.read_text(encoding="utf-8").splitlines()[lineno + (1 if header else 0)]
    parts = line.rstrip().split(" ")
    return parts[0], np.array([float(x) for x in parts[1:]], dtype=np.float64)


@pytest.mark.parametrize("fname,header", [("lee_fasttext.vec", True), ("test_glove.txt", False), (W2V_TEXT, True)])
def test_text_values_exact(fname, header):
    """Not normalised: every value is the stored decimal rounded once to float32."""
    path = DATA / fname
    emb = formats.read_vectors(path)
    for i in (0, 1, emb.size - 1):
        word, row = _text_row(path, i, header)
        assert emb.words[i] == word
        np.testing.assert_array_equal(emb.vectors[i], row.astype(np.float32))


def test_binary_values_exact():
    path = DATA / "euclidean_vectors.bin"
    raw = path.read_bytes()
    header_end = raw.index(b"\n") + 1
    size, dim = map(int, raw[:header_end].split())
    word_end = raw.index(b" ", header_end)
    first = np.array(struct.unpack(f"<{dim}f", raw[word_end + 1 : word_end + 1 + 4 * dim]), dtype=np.float32)
    emb = formats.read_vectors(path)
    assert emb.words[0] == raw[header_end:word_end].decode()
    np.testing.assert_array_equal(emb.vectors[0], first)
    # Same words as the file order announces; norms are the stored ones (nothing normalised).
    assert not np.allclose(np.linalg.norm(emb.vectors, axis=1), 1.0)


def test_text_and_binary_agree():
    a = formats.read_vectors(DATA / "high_precision.kv.txt")
    b = formats.read_vectors(DATA / "high_precision.kv.bin")
    assert a.words == b.words
    # The two files were written separately (the .bin holds slightly different float32 values;
    # gensim's own test compares them at a loose tolerance too).
    np.testing.assert_allclose(a.vectors, b.vectors, rtol=1e-3)


def test_vocab_size_keeps_first_rows():
    full = formats.read_vectors(DATA / "lee_fasttext.vec")
    head = formats.read_vectors(DATA / "lee_fasttext.vec", vocab_size=100)
    assert head.words == full.words[:100]
    np.testing.assert_array_equal(head.vectors, full.vectors[:100])
    headb = formats.read_vectors(DATA / "euclidean_vectors.bin", vocab_size=7)
    assert headb.size == 7
    with pytest.raises(ValueError, match="only"):
        formats.read_vectors(DATA / "test_glove.txt", vocab_size=1000)
    with pytest.raises(ValueError):
        formats.read_vectors(DATA / "test_glove.txt", vocab_size=0)


def test_cached_memmap(tmp_path):
    emb = formats.load_vectors(DATA / "lee_fasttext.vec", vocab_size=500, cache_dir=tmp_path)
    assert isinstance(emb.vectors, np.memmap) and not emb.vectors.flags.writeable
    assert "diameter" in emb._memo
    again = formats.load_vectors(DATA / "lee_fasttext.vec", vocab_size=500, cache_dir=tmp_path)
    assert again.words == emb.words
    np.testing.assert_array_equal(
        again.vectors, formats.read_vectors(DATA / "lee_fasttext.vec", vocab_size=500).vectors
    )
    assert formats.open_embedding(str(DATA / "lee_fasttext.vec"), 500, cache_dir=tmp_path).words == emb.words


def test_invalid_utf8_is_an_error_unless_asked():
    path = DATA / "pang_lee_polarity_fasttext.vec"
    if not path.exists():
        pytest.skip("file not in this gensim version")
    with pytest.raises(UnicodeDecodeError):
        formats.read_vectors(path)
    emb = formats.read_vectors(path, errors="replace")
    assert emb.size > 0


def test_malformed(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("3 2\na 1 2\nb 1\n", encoding="utf-8")
    with pytest.raises(formats.EmbeddingFormatError):
        formats.read_vectors(bad)
    short = tmp_path / "short.txt"
    short.write_text("3 2\na 1 2\nb 1 2\n", encoding="utf-8")
    with pytest.raises(formats.EmbeddingFormatError, match="announces"):
        formats.read_vectors(short)
    dup = tmp_path / "dup.txt"
    dup.write_text("a 1 2\nb 3 4\na 5 6\n", encoding="utf-8")
    emb = formats.read_vectors(dup)
    assert emb.words == ("a", "b") and "1 repeated" in emb.source
    np.testing.assert_array_equal(emb.vectors[0], [1, 2])
    spaced = tmp_path / "spaced.txt"
    spaced.write_text("a b 1 2\nc 3 4\n", encoding="utf-8")
    assert formats.read_vectors(spaced).words == ("a b", "c")


def test_open_cached_directory_with_vocab_size(glove_prefix, tmp_path):
    from lac.client.embedding import save
    from lac.client.formats import open_embedding

    emb = glove_prefix(300)
    save(emb, tmp_path / "e")
    whole = open_embedding(str(tmp_path / "e"), None)
    assert whole.size == 300 and isinstance(whole.vectors, np.memmap)
    part = open_embedding(str(tmp_path / "e"), 100)
    assert part.size == 100 and part.words == emb.words[:100] and isinstance(part.vectors, np.memmap)
    np.testing.assert_array_equal(part.vectors, emb.vectors[:100])  # as stored, nothing normalised


def test_a_glove_file_without_vectors_is_a_format_error(tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n", encoding="utf-8")  # used to fail with AttributeError on the missing collector
    with pytest.raises(formats.EmbeddingFormatError, match="no vectors found"):
        formats.read_vectors(blank, "glove")
