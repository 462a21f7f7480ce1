"""The shuffler service: validate and durably store reports, release shuffled batches,
deliver them to the curator until acknowledged.

All SQLite work runs on one dedicated thread; the asyncio loop only awaits it.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

import grpc

from lac.common.errors import InvalidArgument
from lac.common.v1 import curator_pb2, curator_pb2_grpc, reports_pb2, shuffler_pb2
from lac.shuffler.config import ShufflerConfig
from lac.shuffler.reportlog import Payload, ReportLog

log = logging.getLogger(__name__)

MIN_IDEMPOTENCY_BYTES = 8
MAX_IDEMPOTENCY_BYTES = 64


class Shuffler:
    """Library object behind the gRPC servicer (also usable directly in tests)."""

    def __init__(self, config: ShufflerConfig):
        self.config = config
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reportlog")
        self._log = ReportLog(config.state_dir)
        self._wake_forwarder = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.note = ""

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._forward_loop()), asyncio.create_task(self._epoch_loop())]
        self._wake_forwarder.set()  # deliver batches left over from before a restart

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._run(self._log.close)
        self._executor.shutdown()

    def validate(self, reports) -> list[tuple[bytes, Payload]]:
        cfg = self.config
        if not reports:
            raise InvalidArgument("no reports in request")
        if len(reports) > cfg.max_reports_per_request:
            raise InvalidArgument(f"{len(reports)} reports in one request; at most {cfg.max_reports_per_request}")
        out = []
        for i, r in enumerate(reports):
            if not MIN_IDEMPOTENCY_BYTES <= len(r.idempotency_id) <= MAX_IDEMPOTENCY_BYTES:
                raise InvalidArgument(f"report {i}: idempotency_id must be {MIN_IDEMPOTENCY_BYTES}.."
                                      f"{MAX_IDEMPOTENCY_BYTES} bytes, got {len(r.idempotency_id)}")
            p = r.payload
            if p.encoding == reports_pb2.PAYLOAD_ENCODING_UNSPECIFIED:
                raise InvalidArgument(f"report {i}: payload encoding is unspecified")
            if not p.data:
                raise InvalidArgument(f"report {i}: empty payload")
            if len(p.data) > cfg.max_report_bytes:
                raise InvalidArgument(f"report {i}: payload of {len(p.data)} bytes exceeds {cfg.max_report_bytes}")
            out.append((r.idempotency_id, Payload(p.encoding, p.key_id, p.data)))
        return out

    async def submit(self, reports) -> list[bool]:
        """Validate, store durably, and release a batch if the buffer reached ``min_batch``."""
        try:
            items = self.validate(reports)
        except InvalidArgument:
            await self._run(self._log.count_reject, "invalid_argument")
            raise
        stored = await self._run(self._log.append, items)
        if await self._run(self._log.buffered) >= self.config.min_batch:
            await self.flush()
        return stored

    async def flush(self) -> tuple[str, int] | None:
        released = await self._run(self._log.release, self.config.min_batch)
        if released is None:
            n = await self._run(self._log.buffered)
            self.note = f"{n} reports buffered, fewer than min_batch={self.config.min_batch}: carried over"
            return None
        batch_id, size = released
        self.note = f"released batch {batch_id} of {size} reports"
        log.info("released batch %s of %d shuffled reports", batch_id, size)
        self._wake_forwarder.set()
        return released

    async def status(self) -> shuffler_pb2.ShufflerStatus:
        counters = await self._run(self._log.counters)
        pending = await self._run(self._log.pending_batches)
        return shuffler_pb2.ShufflerStatus(
            buffered_reports=await self._run(self._log.buffered), min_batch=self.config.min_batch,
            batches_forwarded=counters.get("batches_forwarded", 0),
            reports_forwarded=counters.get("reports_forwarded", 0), batches_pending=len(pending),
            rejects={k.split(":", 1)[1]: v for k, v in counters.items() if k.startswith("reject:")},
            note=self.note)

    async def _epoch_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.epoch_seconds)
            await self.flush()

    async def _forward_loop(self) -> None:
        delay = 0.5
        async with grpc.aio.insecure_channel(self.config.curator) as channel:
            stub = curator_pb2_grpc.CuratorIngestStub(channel)
            while True:
                await self._wake_forwarder.wait()
                self._wake_forwarder.clear()
                for batch_id in await self._run(self._log.pending_batches):
                    while True:
                        payloads = await self._run(self._log.batch, batch_id)
                        request = curator_pb2.IngestBatchRequest(batch_id=batch_id, reports=[
                            reports_pb2.SealedPayload(encoding=p.encoding, key_id=p.key_id, data=p.data)
                            for p in payloads])
                        try:
                            reply = await stub.IngestBatch(request, timeout=60)
                        except grpc.aio.AioRpcError as exc:
                            log.warning("curator did not take batch %s (%s: %s); retrying in %.1fs",
                                        batch_id, exc.code().name, exc.details(), delay)
                            await asyncio.sleep(delay)
                            delay = min(delay * 2, self.config.forward_retry_max_seconds)
                            continue
                        delay = 0.5
                        await self._run(self._log.delivered, batch_id)
                        log.info("curator acknowledged batch %s (%d accepted, %d rejected%s)", batch_id,
                                 reply.accepted, reply.rejected, ", already stored" if reply.duplicate else "")
                        break
