"""Ingest on Apache Spark: ``SparkIngest`` opens, validates and counts ingested batches on the executors
(``lac.curator.ingest.chunks.ingest_chunk`` in ``mapInArrow``), with the interface of the local
``IngestPool``; the driver still drops replays and commits the segment. Optional (``ingest_engine =
"spark"``; ``pip install 'lac-curator[spark]'``); the session and its jobs are the Spark engine's
(``lac.curator.engines.spark``). See docs/operator/spark.md for what executors are trusted with.
"""

from __future__ import annotations

import asyncio
import pickle
import zlib
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from typing import Any

from lac.curator.engines.spark import collect
from lac.curator.ingest.chunks import CHUNK_REPORTS, ingest_chunk

__all__ = ["KEY_SAFE_CONF", "SparkIngest", "key_shipping_gaps"]


def _master(session: Any) -> str:
    """The master URL of a classic session ("sc://" for a Connect one, whose URL it does not show)."""
    if "connect" in type(session).__module__:
        return "sc://"
    return str(session.conf.get("spark.master"))


def _conf(session: Any) -> dict[str, str]:
    """The settings ``key_shipping_gaps`` reads."""
    return {k: str(session.conf.get(k, "false")) for k in KEY_SAFE_CONF}


def _count_chunks(ctx: bytes, level: int, batches: Iterator[Any]) -> Iterator[Any]:
    """The executors' side of ``SparkIngest`` (``mapInArrow``): rows (chunk, position, payload)
    sorted by chunk and position, a partition holding whole chunks; one output row per chunk."""
    import pyarrow as pa

    context = pickle.loads(ctx)

    def out(chunk: int, payloads: list[bytes]) -> Any:
        blob = zlib.compress(pickle.dumps(ingest_chunk(context, payloads), protocol=pickle.HIGHEST_PROTOCOL), level)
        return pa.RecordBatch.from_arrays(
            [pa.array([chunk], pa.int32()), pa.array([blob], pa.binary())], names=["chunk", "counted"]
        )

    current = -1  # the chunk of ``payloads`` (set whenever it is not empty)
    payloads: list[bytes] = []
    for batch in batches:  # a chunk may span Arrow batches
        for chunk, payload in zip(batch.column(0).to_pylist(), batch.column(2).to_pylist()):
            if chunk != current and payloads:
                yield out(current, payloads)
                payloads = []
            current = chunk
            payloads.append(payload)
    if payloads:
        yield out(current, payloads)


KEY_SAFE_CONF = {
    "spark.authenticate": "the executors and the driver authenticate each other (a shared secret)",
    "spark.network.crypto.enabled": "RPC traffic, which carries the tasks and so the keys, is encrypted (AES)",
    "spark.io.encryption.enabled": "shuffle and spill files, which hold opened reports, are encrypted on disk",
}
"""Settings a classic session on a cluster must have on before executors get the curator's private keys."""


def key_shipping_gaps(master: str, conf: Mapping[str, str]) -> list[str]:
    """Why it is unsafe to ship the curator's private keys to the executors of a session on ``master``
    whose settings are ``conf`` ([]: safe). ``local[...]``: the executors are this machine's processes,
    reached over loopback, inside the curator's boundary. ``sc://``: the Connect URL must ask for TLS
    (``use_ssl=true``) and carry a token. A cluster: every setting of ``KEY_SAFE_CONF`` must be true."""
    if master == "local" or master.startswith("local["):
        return []
    if master.startswith("sc://"):
        params = dict(kv.split("=", 1) for kv in master.partition("/;")[2].split(";") if "=" in kv)
        gaps = []
        if params.get("use_ssl", "").lower() != "true":
            gaps.append("use_ssl=true in the sc:// URL (TLS to the Connect server)")
        if not params.get("token"):
            gaps.append("token=... in the sc:// URL (the Connect server authenticates the curator)")
        return gaps
    return [f"{k}=true ({why})" for k, why in KEY_SAFE_CONF.items() if str(conf.get(k, "false")).lower() != "true"]


class SparkIngest:
    """Opens, validates and counts sealed reports on Spark (``lac.curator.ingest.chunks.ingest_chunk`` in
    ``mapInArrow`` over a DataFrame of (chunk, position, serialized ``SealedPayload``)), with the
    interface of ``lac.curator.ingest.chunks.IngestPool``: the chunks come back in batch order and
    ``merge_counts`` makes the same segment as single-node ingest, byte for byte.

    The executors get the curator's PRIVATE HPKE keys (in ``ctx``, shipped with the task) and see
    the opened reports: they are inside the curator's trust boundary. Run them on machines only
    the curator's operator controls, with Spark's authentication and encryption on
    (``spark.authenticate``, ``spark.network.crypto.enabled``, ``spark.io.encryption.enabled``;
    TLS to a Spark Connect server)."""

    ok = True  # no local worker processes to break (Spark retries its own tasks)
    deaths = stalls = 0

    def __init__(
        self,
        ctx: Any,
        session: Any,
        chunk_reports: int | None = None,
        compress_level: int = 1,
        master: str | None = None,
    ):
        """Refuses (``ValueError``) a session that would ship the keys unprotected (``key_shipping_gaps``);
        ``master``: the URL the session was made from (needed for a Spark Connect session)."""
        master = master or _master(session)
        gaps = key_shipping_gaps(master, _conf(session))
        if gaps:
            raise ValueError(
                f"ingest on Spark ships the curator's PRIVATE keys to the executors of {master}; refusing "
                f"until the session has: {'; '.join(gaps)} (docs/operator/spark.md)"
            )
        self.ctx, self.session = ctx, session
        self.chunk_reports = chunk_reports or CHUNK_REPORTS
        self.compress_level = compress_level

    def pooled(self, n_reports: int) -> bool:
        """Every batch goes to Spark."""
        return True

    def run(self, payloads: Sequence[bytes]) -> list[Any]:
        """The batch's ``CountedChunk``s, in batch order (blocking: one Spark job)."""
        n = len(payloads)
        if n == 0:
            return [ingest_chunk(self.ctx, [])]
        n_chunks = -(-n // self.chunk_reports)
        rows = [(i * n_chunks // n, i, bytes(p)) for i, p in enumerate(payloads)]
        df = (
            self.session.createDataFrame(rows, schema="chunk int, pos long, payload binary")
            .repartitionByRange(n_chunks, "chunk")
            .sortWithinPartitions("chunk", "pos")
        )
        ctx = pickle.dumps(self.ctx, protocol=pickle.HIGHEST_PROTOCOL)
        out = df.mapInArrow(partial(_count_chunks, ctx, self.compress_level), "chunk int, counted binary")
        got = sorted((int(r[0]), bytes(r[1])) for r in collect(out, "an ingested batch"))
        if [c for c, _ in got] != list(range(n_chunks)):
            raise RuntimeError(f"spark returned chunks {[c for c, _ in got]}, expected 0..{n_chunks - 1}")
        return [pickle.loads(zlib.decompress(blob)) for _, blob in got]

    async def count(self, payloads: Sequence[bytes]) -> list[Any]:
        """``run`` without blocking the event loop."""
        return await asyncio.to_thread(self.run, payloads)

    def worker_pids(self) -> list[int]:
        """No local worker processes (the executors are Spark's)."""
        return []

    def close(self) -> None:
        """Nothing to stop (the session belongs to the release engine or the caller)."""
