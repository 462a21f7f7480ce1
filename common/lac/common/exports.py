"""The format of an export of privatized reports, which the curator writes and the analyst reads: one
Arrow column ``words`` (list<string>) per row, sent as Arrow IPC messages (``ipc_bytes``/``read_ipc``), and the
key-value metadata an exported Parquet file carries (``parquet_metadata``: the ``LocalGuarantee`` as JSON, its
statement, the export's id).

Needs pyarrow, which lac-curator and lac-analyst[arrow] install (lac-common alone does not).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import pyarrow as pa

from lac.common.privacy import LocalGuarantee

__all__ = [
    "SCHEMA",
    "PARQUET_GUARANTEE_KEY",
    "PARQUET_STATEMENT_KEY",
    "PARQUET_EXPORT_ID_KEY",
    "ipc_bytes",
    "read_ipc",
    "guarantee_json",
    "parquet_metadata",
]

SCHEMA = pa.schema([pa.field("words", pa.list_(pa.string()), nullable=False)])
PARQUET_GUARANTEE_KEY = "lac.export.guarantee"  # Parquet key-value metadata: the LocalGuarantee as JSON
PARQUET_STATEMENT_KEY = "lac.export.statement"  # ... and its statement
PARQUET_EXPORT_ID_KEY = "lac.export.id"  # ... and the export's id


def ipc_bytes(words: pa.Array) -> bytes:
    """One Arrow IPC stream (schema, one record batch) of ``words`` as ``SCHEMA``."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SCHEMA) as w:
        w.write_batch(pa.record_batch([words], schema=SCHEMA))
    data: bytes = sink.getvalue().to_pybytes()
    return data


def read_ipc(data: bytes) -> pa.Table:
    """The rows of one ``ipc_bytes`` message (InvalidArgument-free: a malformed one raises pyarrow's error)."""
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def guarantee_json(g: LocalGuarantee) -> str:
    """The guarantee as JSON (what the ledger and the Parquet metadata keep)."""
    return json.dumps(g.to_dict(), ensure_ascii=False, sort_keys=True)


def parquet_metadata(g: LocalGuarantee, export_id: str) -> Mapping[bytes, bytes]:
    """The key-value metadata an exported Parquet file carries: the guarantee (JSON), its statement, the id."""
    return {
        PARQUET_GUARANTEE_KEY.encode(): guarantee_json(g).encode(),
        PARQUET_STATEMENT_KEY.encode(): g.statement().encode(),
        PARQUET_EXPORT_ID_KEY.encode(): export_id.encode(),
    }
