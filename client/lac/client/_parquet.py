"""Read one string column of a Parquet file without pyarrow: the GloVe wheel's word index, once.

Only what such a file needs is implemented: a flat (non-nested) BYTE_ARRAY column, dictionary or
plain encoded, in v1 or v2 data pages, uncompressed, Snappy or gzip. Anything else raises
``ParquetUnsupported``, naming what it met. The file's footer is Thrift's compact protocol, decoded
here generically into ``{field id: value}`` dicts.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ParquetUnsupported", "read_string_column", "snappy_decompress", "string_columns"]

_MAGIC = b"PAR1"
# Thrift compact types
_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(13)
# Parquet enums
_BYTE_ARRAY = 6
_OPTIONAL, _REPEATED = 1, 2
_PLAIN, _PLAIN_DICTIONARY, _RLE, _RLE_DICTIONARY = 0, 2, 3, 8
_UNCOMPRESSED, _SNAPPY, _GZIP = 0, 1, 2
_DATA_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 2, 3


class ParquetUnsupported(ValueError):
    """The file is not Parquet, or uses a feature this reader does not implement."""


class _Thrift:
    """A cursor over Thrift compact-protocol bytes."""

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data, self.pos = data, pos

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.data[self.pos]
            self.pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result
            shift += 7

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def value(self, kind: int) -> Any:
        if kind in (_TRUE, _FALSE):  # inside a struct the type is the value; in a list, one byte follows
            return kind == _TRUE
        if kind == _BYTE:
            self.pos += 1
            return self.data[self.pos - 1]
        if kind in (_I16, _I32, _I64):
            return self.zigzag()
        if kind == _DOUBLE:
            self.pos += 8
            return struct.unpack_from("<d", self.data, self.pos - 8)[0]
        if kind == _BINARY:
            n = self.varint()
            self.pos += n
            return self.data[self.pos - n : self.pos]
        if kind in (_LIST, _SET):
            head = self.data[self.pos]
            self.pos += 1
            size, elem = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            if elem in (_TRUE, _FALSE):
                self.pos += size
                return [b == 1 for b in self.data[self.pos - size : self.pos]]
            return [self.value(elem) for _ in range(size)]
        if kind == _MAP:
            size = self.varint()
            if not size:
                return {}
            types = self.data[self.pos]
            self.pos += 1
            return {self.value(types >> 4): self.value(types & 0x0F) for _ in range(size)}
        if kind == _STRUCT:
            return self.struct()
        raise ParquetUnsupported(f"unknown Thrift type {kind}")

    def struct(self) -> dict[int, Any]:
        out: dict[int, Any] = {}
        field = 0
        while True:
            head = self.data[self.pos]
            self.pos += 1
            kind = head & 0x0F
            if kind == _STOP:
                return out
            field = field + (head >> 4) if head >> 4 else self.zigzag()
            out[field] = self.value(kind)


def snappy_decompress(data: bytes) -> bytes:
    """The raw (unframed) Snappy block ``data``, decompressed."""
    src = _Thrift(data)
    size = src.varint()
    out = bytearray()
    pos, n = src.pos, len(data)
    while pos < n:
        tag = data[pos]
        pos += 1
        kind = tag & 3
        if kind == 0:  # literal
            length = tag >> 2
            if length >= 60:
                extra = length - 59
                length = int.from_bytes(data[pos : pos + extra], "little")
                pos += extra
            length += 1
            out += data[pos : pos + length]
            pos += length
            continue
        if kind == 1:
            length = ((tag >> 2) & 7) + 4
            offset = ((tag >> 5) << 8) | data[pos]
            pos += 1
        else:
            width = 2 if kind == 2 else 4
            length = (tag >> 2) + 1
            offset = int.from_bytes(data[pos : pos + width], "little")
            pos += width
        start = len(out) - offset
        if offset == 0 or start < 0:
            raise ParquetUnsupported("corrupt Snappy data (copy before the start)")
        if offset >= length:
            out += out[start : start + length]
        else:  # overlapping copy: the last `offset` bytes repeat
            chunk = out[start:]
            out += (chunk * (length // offset + 1))[:length]
    if len(out) != size:
        raise ParquetUnsupported(f"corrupt Snappy data ({len(out)} bytes, expected {size})")
    return bytes(out)


def _decompress(codec: int, data: bytes) -> bytes:
    if codec == _UNCOMPRESSED:
        return data
    if codec == _SNAPPY:
        return snappy_decompress(data)
    if codec == _GZIP:
        return zlib.decompress(data, 47)  # gzip or zlib header
    raise ParquetUnsupported(f"compression codec {codec} (only none, Snappy and gzip are read)")


def _hybrid(data: bytes, pos: int, bit_width: int, count: int) -> np.ndarray:
    """``count`` values of Parquet's RLE/bit-packed hybrid encoding starting at ``data[pos]``."""
    out = np.empty(count, dtype=np.int64)
    done = 0
    cur = _Thrift(data, pos)
    width_bytes = (bit_width + 7) // 8
    weights = (1 << np.arange(bit_width, dtype=np.int64)) if bit_width else np.zeros(0, dtype=np.int64)
    while done < count:
        header = cur.varint()
        if header & 1:  # bit-packed groups of 8 values, least significant bit first
            n = (header >> 1) * 8
            nbytes = (header >> 1) * bit_width
            raw = np.frombuffer(data, dtype=np.uint8, count=nbytes, offset=cur.pos)
            cur.pos += nbytes
            bits = np.unpackbits(raw, bitorder="little").reshape(n, bit_width).astype(np.int64)
            take = min(n, count - done)
            out[done : done + take] = (bits @ weights)[:take]
        else:  # a run of one value
            take = min(header >> 1, count - done)
            out[done : done + take] = int.from_bytes(data[cur.pos : cur.pos + width_bytes], "little")
            cur.pos += width_bytes
        done += take
    return out


def _plain_strings(data: bytes, pos: int, count: int) -> list[bytes]:
    out = []
    unpack = struct.Struct("<I").unpack_from
    for _ in range(count):
        (n,) = unpack(data, pos)
        out.append(data[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return out


def _footer(raw: bytes, path: str | Path) -> tuple[dict[int, Any], list[dict[int, Any]]]:
    """The file's metadata and its leaf schema elements (one per column)."""
    if len(raw) < 12 or raw[:4] != _MAGIC or raw[-4:] != _MAGIC:
        raise ParquetUnsupported(f"{path} is not a Parquet file")
    (meta_len,) = struct.unpack_from("<I", raw, len(raw) - 8)
    meta = _Thrift(raw, len(raw) - 8 - meta_len).struct()
    leaves = [s for s in meta[2][1:] if not s.get(5)]  # schema elements without children
    if len(leaves) != len(meta[2]) - 1:
        raise ParquetUnsupported("nested schemas are not read")
    return meta, leaves


def string_columns(path: str | Path) -> list[str]:
    """The names of the flat byte-array (string) columns of the Parquet file ``path``."""
    _, leaves = _footer(Path(path).read_bytes(), path)
    return [s[4].decode() for s in leaves if s.get(1) == _BYTE_ARRAY and s.get(3) != _REPEATED]


def read_string_column(path: str | Path, column: str | None = None) -> list[str | None]:
    """Every value of the UTF-8 column ``column`` (the file's only column if None) of the Parquet file
    ``path``, in row order; a null is None."""
    raw = Path(path).read_bytes()
    meta, leaves = _footer(raw, path)
    names = [s[4].decode() for s in leaves]
    if column is None and len(names) != 1:
        raise ParquetUnsupported(f"name the column to read among {names}")
    if column is not None and column not in names:
        raise ParquetUnsupported(f"no column {column!r} among {names}")
    index = names.index(column) if column is not None else 0
    schema = leaves[index]
    if schema.get(1) != _BYTE_ARRAY or schema.get(3) == _REPEATED:
        raise ParquetUnsupported(f"column {names[index]!r} is not a flat byte-array column")
    optional = schema.get(3) == _OPTIONAL
    values: list[bytes | None] = []
    for group in meta.get(4, []):
        values += _read_chunk(raw, group[1][index][3], optional)
    if len(values) != meta[3]:
        raise ParquetUnsupported(f"read {len(values)} values for {meta[3]} rows")
    return [None if v is None else v.decode("utf-8") for v in values]


def _read_chunk(raw: bytes, col: dict[int, Any], optional: bool) -> list[bytes | None]:
    """The values of one column chunk (``col``: its ColumnMetaData)."""
    codec, remaining = col[4], col[5]
    pos = col.get(11) or col[9]  # the dictionary page, if any, comes first
    dictionary: list[bytes] = []
    out: list[bytes | None] = []
    while remaining > 0:
        cur = _Thrift(raw, pos)
        header = cur.struct()
        body = raw[cur.pos : cur.pos + header[3]]
        pos = cur.pos + header[3]
        kind = header[1]
        if kind == _DICTIONARY_PAGE:
            page = header[7]
            if page.get(2, _PLAIN) not in (_PLAIN, _PLAIN_DICTIONARY):
                raise ParquetUnsupported(f"dictionary encoding {page.get(2)}")
            dictionary = _plain_strings(_decompress(codec, body), 0, page[1])
            continue
        if kind == _DATA_PAGE:
            page = header[5]
            count, encoding = page[1], page[2]
            data = _decompress(codec, body)
            at = 0
            if optional:  # definition levels: a 4-byte length, then the hybrid encoding (bit width 1)
                (n,) = struct.unpack_from("<I", data, 0)
                defined = _hybrid(data, 4, 1, count)
                at = 4 + n
            else:
                defined = None
        elif kind == _DATA_PAGE_V2:
            page = header[8]
            count, encoding, def_len, rep_len = page[1], page[4], page[5], page[6]
            if rep_len:
                raise ParquetUnsupported("repetition levels are not read")
            levels, values = body[:def_len], body[def_len:]
            if page.get(7, True):
                values = _decompress(codec, values)
            data = levels + values
            defined = _hybrid(data, 0, 1, count) if optional else None
            at = def_len
        else:
            raise ParquetUnsupported(f"page type {kind}")
        present = count if defined is None else int(defined.sum())
        if encoding == _PLAIN:
            vals = _plain_strings(data, at, present)
        elif encoding in (_PLAIN_DICTIONARY, _RLE_DICTIONARY):
            ids = _hybrid(data, at + 1, data[at], present)
            if present and (ids.min() < 0 or ids.max() >= len(dictionary)):
                raise ParquetUnsupported("dictionary index out of range")
            vals = [dictionary[i] for i in ids.tolist()]
        else:
            raise ParquetUnsupported(f"value encoding {encoding}")
        if defined is None:
            out += vals
        else:
            it = iter(vals)
            out += [next(it) if d else None for d in defined.tolist()]
        remaining -= count
    return out
