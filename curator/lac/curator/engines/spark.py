"""Releases on Apache Spark: ``SparkEngine`` runs a release's folds (``lac.curator.engines.local``) on a
Spark cluster, with the DataFrame API only, so it works with a classic session and with a Spark
Connect one (``sc://...``). Optional: ``pip install 'lac-curator[spark]'`` (on the driver and on
every executor: the executors' Python imports ``lac.curator`` to run LAC's own kernels).

How a fold runs: a DataFrame of (part index, pickled part handle: for stored reports, a segment
path, which every executor must be able to read), repartitioned one part per task, is mapped by
``mapInArrow``: each task loads its segment, applies the fold's function and emits (index, pickled
partial result). The driver collects the partials, sorts them by index and combines them in
segment order, exactly as ``LocalEngine`` does, so releases are bit-identical across engines.
Partials are collected in waves of consecutive parts small enough for the driver
(``max_result_bytes``), so the driver holds one wave of partials plus the accumulator.

Only aggregations run on the cluster. The noise is drawn on the driver after the folds
(``lac.curator.runner.run.run``) and the privacy ledger is committed by the curator service on the
driver, in one transaction with the release record: executors never see a noise draw or the budget.

Ingest on Spark (``SparkIngest``) is ``lac.curator.ingest.spark``; it runs its jobs with this module's
``collect``. See docs/operator/spark.md for installing, shared storage and what executors are trusted with.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import warnings
import zlib
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from lac.common.checks import check_int
from lac.common.errors import DataLoss, Unavailable
from lac.curator.base.ngrams import ReportItems

if TYPE_CHECKING:  # the engine selects this module (create_engine); this module never imports it back
    from lac.curator.engines.local import Parts

__all__ = [
    "INSTALL_HINT",
    "SparkEngine",
    "SparkUnavailable",
    "collect",
    "require_pyspark",
]

log = logging.getLogger(__name__)
T = TypeVar("T")
P = TypeVar("P")

INSTALL_HINT = "pip install 'lac-curator[spark]'"
# Static settings of a session this module starts (a session passed in keeps its own).
_DEFAULT_CONF = {
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.pyspark.udf.faulthandler.enabled": "true",
}


# pyspark warns on every mapInArrow that it "does not yet fully support pandas >= 3"; folds use Arrow only.
warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)


class SparkUnavailable(RuntimeError):
    """pyspark is not installed (the ``spark`` extra)."""


def require_pyspark() -> None:
    """Raise ``SparkUnavailable`` (one line, naming the install command) unless pyspark imports."""
    try:
        import pyspark.sql  # noqa: F401
    except ImportError as exc:
        raise SparkUnavailable(f"the spark engine needs pyspark ({exc}): {INSTALL_HINT}") from None


def collect(df: Any, what: str) -> list:
    """``df.collect()``; a failed Spark job as DATA_LOSS (a segment missing or corrupt) or
    UNAVAILABLE (anything else: executors lost, the cluster unreachable; nothing was stored or
    charged, so a retry is safe)."""
    try:
        return df.collect()
    except Exception as exc:
        text = str(exc)
        lost = [ln for ln in text.splitlines() if "DataLoss:" in ln]
        if lost:
            raise DataLoss(lost[-1].split("DataLoss:", 1)[1].strip()) from exc
        log.error("the Spark job of %s failed", what, exc_info=True)
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
        raise Unavailable(f"the Spark job of {what} failed ({first[:300]}); retry later") from exc


def _map_parts(task: bytes, level: int, batches: Iterator[Any]) -> Iterator[Any]:
    """The executors' side of a fold (``mapInArrow``): one output row per part."""
    import pyarrow as pa

    fn, load = pickle.loads(task)
    for batch in batches:
        for index, handle in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
            result = pickle.dumps(fn(load(pickle.loads(handle))), protocol=pickle.HIGHEST_PROTOCOL)
            blob = zlib.compress(result, level)
            # One row per Arrow batch: a batch's binary column holds at most 2 GiB in all.
            yield pa.RecordBatch.from_arrays(
                [pa.array([index], pa.int64()), pa.array([blob], pa.binary())], names=["index", "partial"]
            )


class SparkEngine:
    """Folds on Spark (see the module docstring). ``session``: any ``SparkSession``, classic or
    Spark Connect. ``parts_per_job``: most parts one Spark job maps (the first wave maps at most
    ``first_wave``, to learn the size of a partial); ``max_result_bytes``: the most compressed
    partial bytes one job brings to the driver (keep it under the session's
    ``spark.driver.maxResultSize``, 1 GiB by default)."""

    name = "spark"

    def __init__(
        self,
        session: Any,
        *,
        parts_per_job: int = 256,
        first_wave: int = 16,
        max_result_bytes: int = 256 << 20,
        compress_level: int = 1,
        owned: bool = False,
    ):
        for key, v in (
            ("parts_per_job", parts_per_job),
            ("first_wave", first_wave),
            ("max_result_bytes", max_result_bytes),
        ):
            check_int(v, key)
        self.session = session
        self.parts_per_job = parts_per_job
        self.first_wave = first_wave
        self.max_result_bytes = max_result_bytes
        self.compress_level = compress_level
        self.last_waves: list[int] = []  # the parts each Spark job of the last fold mapped
        self._owned = owned  # True: this engine started the session, and stopping it stops the session

    @classmethod
    def start(
        cls, master: str, conf: Mapping[str, str] | None = None, app_name: str = "lac-curator", **options: Any
    ) -> SparkEngine:
        """A session on ``master``: ``local[N]``, ``spark://host:port``, ``yarn``, ... (classic) or
        ``sc://host:port`` (Spark Connect). With a ``local`` master the executors run this
        process's Python (``PYSPARK_PYTHON``, unless set); on a cluster, install the extra on the
        executors and point ``spark.pyspark.python`` at that Python. A classic session already
        running in this process is reused (it must have the same master) and is not stopped by
        ``stop()``; ``options`` go to the constructor."""
        require_pyspark()
        if master.startswith("sc://"):
            from pyspark.sql.connect.session import SparkSession as ConnectSession

            remote = ConnectSession.builder.remote(master)
            for k, v in (conf or {}).items():
                remote = remote.config(k, v)
            return cls(remote.create(), owned=True, **options)
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        # getActiveSession is per thread: the running context is the process-wide test.
        running = SparkContext._active_spark_context is not None
        if master.startswith("local"):
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = SparkSession.builder.master(master).appName(app_name)
        for k, v in {**_DEFAULT_CONF, **(conf or {})}.items():
            builder = builder.config(k, v)
        session = builder.getOrCreate()
        if running and session.conf.get("spark.master") != master:
            raise ValueError(
                f"a Spark session on {session.conf.get('spark.master')} is already running in this "
                f"process; cannot start one on {master}"
            )
        return cls(session, owned=not running, **options)

    def stop(self) -> None:
        """Stop the session if ``start`` created it (a session passed in, or reused, is the caller's)."""
        if self._owned:
            self._owned = False
            self.session.stop()

    def _map(self, task: bytes, first: int, handles: list[bytes]) -> list[tuple[int, bytes]]:
        """One Spark job: the partials of parts ``first ..`` (compressed pickles), in part order."""
        rows = [(first + k, h) for k, h in enumerate(handles)]
        df = self.session.createDataFrame(rows, schema="index long, part binary").repartition(len(rows))
        out = df.mapInArrow(partial(_map_parts, task, self.compress_level), "index long, partial binary")
        got = sorted((int(r[0]), bytes(r[1])) for r in collect(out, "a release"))
        if [i for i, _ in got] != [r[0] for r in rows]:
            raise RuntimeError(
                f"spark returned partials for parts {[i for i, _ in got]}, expected {first}..{first + len(rows) - 1}"
            )
        return got

    def fold(self, reports: Parts, fn: Callable[[ReportItems], P], combine: Callable[[T, P], T], initial: T) -> T:
        """``combine`` over ``fn`` of every part, in part order, the ``fn`` calls on the executors."""
        parts = list(reports.parts())
        task = pickle.dumps((fn, reports.load), protocol=pickle.HIGHEST_PROTOCOL)
        handles = [pickle.dumps(p, protocol=pickle.HIGHEST_PROTOCOL) for p in parts]
        acc, start, wave = initial, 0, min(self.first_wave, self.parts_per_job)
        self.last_waves = []
        while start < len(handles):
            got = self._map(task, start, handles[start : start + wave])
            self.last_waves.append(len(got))
            largest = max(len(b) for _, b in got)
            for _, blob in got:
                acc = combine(acc, pickle.loads(zlib.decompress(blob)))
            start += len(got)
            wave = max(1, min(self.parts_per_job, self.max_result_bytes // max(largest, 1)))
        return acc

    def __repr__(self) -> str:
        return f"SparkEngine({type(self.session).__module__}.{type(self.session).__name__})"
