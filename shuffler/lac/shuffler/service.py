"""The shuffler service: authenticate, validate and durably store reports (group commit),
release anonymised shuffled batches, deliver them to the curator until acknowledged.

All SQLite work runs on one dedicated thread; the asyncio loop only awaits it. Concurrent
Submit calls queue their reports; one commit task drains the whole queue into a single
fsync'd transaction and then acknowledges every call in it (group commit).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

from lac.common import envelope, tls
from lac.common.envelope import PayloadRejected
from lac.common.errors import InvalidArgument, ResourceExhausted, Unavailable
from lac.common.v1 import curator_pb2, reports_pb2, shuffler_pb2
from lac.shuffler import amplification
from lac.shuffler.auth import Authenticator
from lac.shuffler.config import ShufflerConfig
from lac.shuffler.reportlog import LOG_FULL, OVER_QUOTA, ReportLog, _varint
from lac.shuffler.shuffle import geometric

log = logging.getLogger(__name__)

MIN_IDEMPOTENCY_BYTES = 8
MAX_IDEMPOTENCY_BYTES = 64
MAX_KEY_ID_CHARS = 256
MAX_CROWD_ID_CHARS = 256
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_INGEST_METHOD = "/lac.v1.CuratorIngest/IngestBatch"
_PRIVACY_FIELD = curator_pb2.IngestBatchRequest.DESCRIPTOR.fields_by_name.get("privacy")


class QuotaExceeded(ResourceExhausted):
    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = retry_after


class Shuffler:
    """Library object behind the gRPC servicer (also usable directly in tests)."""

    def __init__(self, config: ShufflerConfig):
        self.config = config
        self._curator_tls = tls.client_tls(config.curator_ca, config.curator_cert or config.tls_cert,
                                           config.curator_key or config.tls_key, insecure=config.insecure,
                                           name="shuffler -> curator")
        self.auth = Authenticator(config.tokens_path, enabled=config.auth == "token")
        if not self.auth.enabled:
            log.warning("AUTHENTICATION DISABLED (auth=none): anyone who can reach this port may submit, and "
                        "there is no per-client quota. Local demos and tests only.")
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reportlog")
        self._log = ReportLog(config.state_dir)
        self._wake_forwarder = asyncio.Event()
        self._pending: list = []
        self._wake_committer = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._threshold = self._draw_threshold()
        self._epoch = self.epoch()
        self.latency_counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.latency_sum = 0.0
        self.forward_failures = 0
        self.metrics_port: int | None = None
        self._metrics_server = None
        self.note = ""

    # ------------------------------------------------------------------ plumbing

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def epoch(self, now: float | None = None) -> int:
        return int((time.time() if now is None else now) // self.config.epoch_seconds)

    def seconds_to_next_epoch(self) -> float:
        now = time.time()
        return (self.epoch(now) + 1) * self.config.epoch_seconds - now

    def _draw_threshold(self) -> int:
        return self.config.min_batch + geometric(self.config.batch_threshold_noise)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._commit_loop()), asyncio.create_task(self._forward_loop()),
                       asyncio.create_task(self._epoch_loop())]
        self._wake_forwarder.set()  # deliver batches left over from before a restart
        if self.config.metrics_port is not None:
            self.metrics_ready = asyncio.create_task(self._start_metrics())

    async def _start_metrics(self) -> int:
        from lac.shuffler.metrics import serve_metrics
        self._metrics_server, self.metrics_port = await serve_metrics(self, self.config.host, self.config.metrics_port)
        log.info("metrics on http://%s:%d/metrics", self.config.host, self.metrics_port)
        return self.metrics_port

    async def stop(self) -> None:
        if self._metrics_server is not None:
            self._metrics_server.close()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for _, _, fut, _ in self._pending:
            if not fut.done():
                fut.set_exception(Unavailable("shuffler is shutting down; retry"))
        await self._run(self._log.close)
        self._executor.shutdown()

    # ------------------------------------------------------------------ ingest

    def validate(self, reports) -> list[tuple[bytes, str | None, bytes]]:
        """(idempotency id, crowd id, serialized payload) per report, or InvalidArgument."""
        cfg = self.config
        if not reports:
            raise InvalidArgument("no reports in request")
        if len(reports) > cfg.max_reports_per_request:
            raise InvalidArgument(f"{len(reports)} reports in one request; at most {cfg.max_reports_per_request}")
        out = []
        unspecified = reports_pb2.PAYLOAD_ENCODING_UNSPECIFIED
        for i, r in enumerate(reports):
            if not MIN_IDEMPOTENCY_BYTES <= len(r.idempotency_id) <= MAX_IDEMPOTENCY_BYTES:
                raise InvalidArgument(f"report {i}: idempotency_id must be {MIN_IDEMPOTENCY_BYTES}.."
                                      f"{MAX_IDEMPOTENCY_BYTES} bytes, got {len(r.idempotency_id)}")
            p = r.payload
            if p.encoding == unspecified:
                raise PayloadRejected("unspecified_encoding", f"report {i}: payload encoding is unspecified")
            try:
                envelope.check_shape(p, cfg.allow_plaintext_payloads, cfg.max_report_bytes)
            except PayloadRejected as exc:
                raise PayloadRejected(exc.reason, f"report {i}: {exc}") from None
            if len(p.key_id) > MAX_KEY_ID_CHARS or len(r.crowd_id) > MAX_CROWD_ID_CHARS:
                raise InvalidArgument(f"report {i}: key_id or crowd_id longer than {MAX_KEY_ID_CHARS} characters")
            out.append((r.idempotency_id, r.crowd_id or None, p.SerializeToString()))
        return out

    async def submit(self, reports, client_id: str | None = None) -> list[bool]:
        """Validate, store durably (group commit), return stored/duplicate per report.

        The caller must have stripped unknown fields (``DiscardUnknownFields``) so that only
        known payload fields are stored and forwarded.
        """
        t0 = time.perf_counter()
        try:
            items = self.validate(reports)
        except InvalidArgument as exc:
            await self._run(self._log.count_reject, getattr(exc, "reason", "invalid_argument"))
            raise
        key = self._log.client_key(client_id) if client_id is not None else None
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((items, key, fut, t0))
        self._wake_committer.set()
        result = await fut
        if result == OVER_QUOTA:
            wait = self.seconds_to_next_epoch()
            raise QuotaExceeded(f"quota of {self.config.quota_per_epoch} report(s) per client per epoch reached; "
                                f"retry after {math.ceil(wait)} s (next epoch)", wait)
        if result == LOG_FULL:
            raise Unavailable(f"report log full ({self._log.used_bytes} of {self.config.max_log_bytes} bytes): "
                              "the curator is not taking batches; retry later")
        return result

    async def _commit_loop(self) -> None:
        while True:
            await self._wake_committer.wait()
            self._wake_committer.clear()
            batch, self._pending = self._pending, []
            if not batch:
                continue
            try:
                results = await self._run(self._log.append_groups, [(b[0], b[1]) for b in batch], self.epoch(),
                                          self.config.quota_per_epoch, self.config.max_log_bytes)
            except Exception as exc:  # noqa: BLE001 - every waiting call learns of the failure
                log.exception("group commit failed")
                results = [Unavailable(f"report log write failed: {exc}")] * len(batch)
            now = time.perf_counter()
            for (_, _, fut, t0), r in zip(batch, results):
                self.latency_counts[bisect.bisect_left(LATENCY_BUCKETS, now - t0)] += 1
                self.latency_sum += now - t0
                if fut.done():
                    continue
                if isinstance(r, Exception):
                    fut.set_exception(r)
                else:
                    fut.set_result(r)
            if self._log.buffered() >= self._threshold:
                await self.flush(self._threshold, "threshold")

    # ------------------------------------------------------------------ release

    async def flush(self, threshold: int | None = None, why: str = "flush") -> tuple[str, int] | None:
        """Release one anonymised shuffled batch if at least ``threshold`` (default min_batch) are buffered."""
        cfg = self.config
        threshold = cfg.min_batch if threshold is None else threshold
        released = await self._run(self._log.release, threshold, cfg.subsample_q, cfg.crowd_threshold,
                                   cfg.max_batch_bytes)
        if released is None:
            n = self._log.buffered()
            bar = (f"min_batch={cfg.min_batch}" if threshold == cfg.min_batch else
                   f"the randomised threshold (min_batch={cfg.min_batch} + secret noise)")
            self.note = f"{why} at epoch {self.epoch()}: {n} reports buffered, fewer than {bar}: carried over"
            return None
        self._threshold = self._draw_threshold()
        dropped = ""
        if released.dropped_subsampled or released.dropped_crowd:
            dropped = (f"; dropped {released.dropped_subsampled} by sub-sampling (q={cfg.subsample_q:g}) and "
                       f"{released.dropped_crowd} by the crowd threshold (k={cfg.crowd_threshold})")
        if released.batch_id is None:
            self.note = f"{why}: all {released.considered} buffered reports were dropped{dropped}"
            return None
        parts = f" in {released.parts} batches of at most {cfg.max_batch_bytes} bytes" if released.parts > 1 else ""
        self.note = f"{why}: released batch {released.batch_id} of {released.size} reports{parts}{dropped}"
        log.info("released batch %s of %d shuffled reports (%s)%s", released.batch_id, released.size, why, dropped)
        self._wake_forwarder.set()
        return released.batch_id, released.size

    def privacy(self, n: int) -> reports_pb2.BatchPrivacy:
        """The amplification statement of a batch of ``n`` reports under this deployment's config."""
        cfg = self.config
        out = reports_pb2.BatchPrivacy(n_reports=n, local_epsilon=cfg.local_epsilon, delta=cfg.target_delta,
                                       subsample_q=cfg.subsample_q, crowd_threshold=cfg.crowd_threshold)
        extra = ""
        if cfg.crowd_threshold:
            extra += (f" Crowd threshold k={cfg.crowd_threshold} applied (Prochlo-style; a data-dependent "
                      "filter, no DP claim of its own).")
        if cfg.subsample_q < 1:
            extra += (f" Reports were Poisson sub-sampled at q={cfg.subsample_q:g} (secret sample) before "
                      "shuffling; the epsilon above does not count that in.")
            if cfg.local_epsilon > 0:  # with no declared eps0 there is nothing to amplify (not "(0, 0)-DP")
                extra += " " + amplification.subsampling_statement(cfg.local_epsilon, cfg.subsample_q)
        if cfg.local_epsilon <= 0:
            out.method = "undeclared"
            out.statement = ("No amplification statement: the operator declared no local epsilon "
                             "(set local_epsilon)." + extra)
            return out
        r = amplification.shuffle_epsilon(cfg.local_epsilon, n, cfg.target_delta)
        out.central_epsilon, out.amplified, out.method = r.epsilon, r.amplified, "fmt21-numerical"
        out.statement = r.statement + extra
        return out

    # ------------------------------------------------------------------ loops

    async def _epoch_loop(self) -> None:
        while True:
            await asyncio.sleep(self.seconds_to_next_epoch() + 0.001)
            ended, self._epoch = self._epoch, self.epoch()
            await self.flush(self.config.min_batch, f"end of epoch {ended}")
            await self._run(self._log.prune_quota, self._epoch)
            await self._run(self._log.rotate_seen, self.config.idempotency_window_days * 86400.0)

    async def _forward_loop(self) -> None:
        delay = 0.5
        async with tls.channel(self.config.curator, self._curator_tls, aio=True) as channel:
            # Raw bytes: the batch was serialized once at release and is sent exactly as stored.
            ingest = channel.unary_unary(_INGEST_METHOD, request_serializer=None,
                                         response_deserializer=curator_pb2.IngestBatchResponse.FromString)
            while True:
                await self._wake_forwarder.wait()
                self._wake_forwarder.clear()
                for batch_id in await self._run(self._log.pending_batches):
                    n, body, privacy = await self._run(self._log.batch, batch_id)
                    if privacy is None:
                        stmt = await asyncio.get_running_loop().run_in_executor(None, self.privacy, n)
                        privacy = stmt.SerializeToString()
                        await self._run(self._log.set_privacy, batch_id, privacy)
                    if _PRIVACY_FIELD is not None:
                        body = body + bytes([(_PRIVACY_FIELD.number << 3) | 2]) + _varint(len(privacy)) + privacy
                    while True:
                        try:
                            reply = await ingest(body, timeout=120)
                        except grpc.aio.AioRpcError as exc:
                            self.forward_failures += 1
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

    # ------------------------------------------------------------------ operator view

    async def status(self) -> shuffler_pb2.ShufflerStatus:
        counters = await self._run(self._log.counters)
        pending = await self._run(self._log.pending_batches)
        recent = await self._run(self._log.recent_batches)
        cfg = self.config
        return shuffler_pb2.ShufflerStatus(
            buffered_reports=self._log.buffered(), min_batch=cfg.min_batch,
            batches_forwarded=counters.get("batches_forwarded", 0),
            reports_forwarded=counters.get("reports_forwarded", 0), batches_pending=len(pending),
            rejects={k.split(":", 1)[1]: v for k, v in counters.items() if k.startswith("reject:")},
            note=self.note, epoch=self.epoch(), seconds_to_next_epoch=self.seconds_to_next_epoch(),
            log_bytes=self._log.used_bytes, max_log_bytes=cfg.max_log_bytes,
            counters={k: v for k, v in counters.items() if not k.startswith("reject:")},
            recent_batches=[shuffler_pb2.BatchInfo(batch_id=b, size=n, delivered=bool(d),
                                                   privacy=reports_pb2.BatchPrivacy.FromString(p or b""))
                            for b, n, d, p in recent],
            auth="token" if self.auth.enabled else "none (INSECURE)")

    async def count_reject(self, reason: str, n: int = 1) -> None:
        await self._run(self._log.count_reject, reason, n)

    async def counters(self) -> dict[str, int]:
        return await self._run(self._log.counters)

    def buffered(self) -> int:
        return self._log.buffered()

    def used_bytes(self) -> int:
        return self._log.used_bytes

