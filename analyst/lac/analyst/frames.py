"""Tables of the analyst client's answers: pandas DataFrames (``lac-analyst[frames]``) or Arrow tables
(``lac-analyst[arrow]``), each imported on first use."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import pandas
    import pyarrow


EXTRA_FRAMES = "lac-analyst[frames]"  # pandas
EXTRA_ARROW = "lac-analyst[arrow]"  # pyarrow


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as exc:
        raise ImportError(f"Arrow tables, Parquet files and exports need pyarrow: pip install '{EXTRA_ARROW}'") from exc
    return pyarrow


def _pandas():
    try:
        import pandas
    except ImportError as exc:
        raise ImportError(
            f"DataFrames need pandas: pip install '{EXTRA_FRAMES}' (or pass as_arrow=True for an Arrow "
            f"table, which needs pyarrow only: '{EXTRA_ARROW}')"
        ) from exc
    return pandas


# The column types of the tables (``CuratorClient._table``), as Arrow and as pandas build them.
STRING, INT8, INT64, FLOAT64, BOOL = "string", "int8", "int64", "float64", "bool"
NULLABLE_INT64 = "int64?"  # values: int or None (a DataFrame holds float64 with NaN once one is None, as Arrow's)
TIMESTAMP = "timestamp[us, UTC]"  # values: datetime (UTC) or None
PARAMS = "map<string, float64>"  # values: (name, value) pairs; a DataFrame holds a dict per row


def _arrow_table(columns: Mapping[str, tuple[Any, str]], metadata: Mapping[str, str] | None = None) -> pyarrow.Table:
    """A typed Arrow table of ``columns`` (name -> (values, column type)) with the schema ``metadata``."""
    pa = _pyarrow()
    types = {
        STRING: pa.string(),
        INT8: pa.int8(),
        INT64: pa.int64(),
        NULLABLE_INT64: pa.int64(),
        FLOAT64: pa.float64(),
        BOOL: pa.bool_(),
        TIMESTAMP: pa.timestamp("us", tz="UTC"),
        PARAMS: pa.map_(pa.string(), pa.float64()),
    }
    schema = pa.schema(
        [pa.field(name, types[kind]) for name, (_, kind) in columns.items()],
        metadata={k.encode(): v.encode() for k, v in (metadata or {}).items()} or None,
    )
    arrays = [pa.array(values, type=types[kind]) for values, kind in columns.values()]
    return pa.Table.from_arrays(arrays, schema=schema)


def _frame(columns: Mapping[str, tuple[Any, str]], attrs: Mapping[str, Any] | None = None) -> pandas.DataFrame:
    """A DataFrame of ``columns`` (name -> (values, column type)) with the dtypes an Arrow table of them
    converts to (strings as pandas' ``str``, int8, int64, float64, bool, ``datetime64[us, UTC]``, a dict
    per row of a map), built without pyarrow; ``attrs`` in ``df.attrs``."""
    pd = _pandas()

    def series(values: Any, kind: str) -> Any:
        if kind == STRING:
            return pd.Series(list(values), dtype="str")
        if kind == TIMESTAMP:
            return pd.Series(pd.to_datetime(list(values), utc=True)).astype("datetime64[us, UTC]")
        if kind == PARAMS:
            return pd.Series([dict(v) for v in values], dtype=object)
        if kind == NULLABLE_INT64:
            values = list(values)
            if None not in values:
                return pd.Series(np.asarray(values, dtype=np.int64))
            return pd.Series(np.asarray([math.nan if v is None else v for v in values], dtype=np.float64))
        return pd.Series(np.asarray(values, dtype=kind))

    df = pd.DataFrame({name: series(values, kind) for name, (values, kind) in columns.items()})
    df.attrs.update(attrs or {})
    return df


def _orders(ngrams: Iterable[str]) -> list[int]:
    """The n of each n-gram (tokens joined by single spaces)."""
    return [len(g.split()) for g in ngrams]
