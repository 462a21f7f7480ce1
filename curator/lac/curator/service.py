"""The curator service: idempotent batch ingest, releases, queries (library behind the servicer)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

import numpy as np

from lac.common import envelope
from lac.common.errors import InvalidArgument, LacError, NotFound
from lac.common.v1 import curator_pb2, reports_pb2
from lac.curator.bayesian import BayesianParams, BayesianRelease, bayesian_dp
from lac.curator.config import CuratorConfig
from lac.curator.ngrams import NgramVocabulary, user_counts
from lac.curator.store import CuratorStore

log = logging.getLogger(__name__)


def compute_release(reports, vocab: NgramVocabulary, params: BayesianParams, max_items_per_report: int,
                    rng: np.random.Generator | None = None) -> BayesianRelease:
    """BayesianDP over per-report n-gram counts: the whole release computation, server or not."""
    counts = user_counts(reports, vocab, C=int(params.C), W=max_items_per_report)
    return bayesian_dp(counts, vocab.alpha, params, rng)


def bayesian_params(request: curator_pb2.ReleaseRequest) -> BayesianParams:
    if request.mechanism not in ("", "bayesian"):
        raise InvalidArgument(f"unknown mechanism {request.mechanism!r}; available: bayesian")
    overrides = {k: v for k, v in (("S", request.s), ("C", request.c), ("rho", request.rho),
                                   ("sensitivity", request.sensitivity), ("calibration", request.calibration)) if v}
    return BayesianParams(epsilon=request.epsilon, delta=request.delta, **overrides)


class Curator:
    def __init__(self, config: CuratorConfig, vocab: NgramVocabulary):
        self.config = config
        self.vocab = vocab
        self.store = CuratorStore(config.state_dir)
        self._db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="curator-store")

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._db, fn, *args)

    async def stop(self) -> None:
        await self._run(self.store.close)
        self._db.shutdown()

    def _validate(self, content: reports_pb2.ReportContent) -> None:
        cfg = self.config
        if len(content.sentences) > cfg.max_sentences_per_report:
            raise InvalidArgument(f"{len(content.sentences)} sentences; at most {cfg.max_sentences_per_report}")
        for s in content.sentences:
            for t in s.tokens:
                if not t or len(t) > cfg.max_token_chars:
                    raise InvalidArgument(f"token of length {len(t)}; must be 1..{cfg.max_token_chars}")

    def open_batch(self, payloads) -> tuple[list[reports_pb2.ReportContent], dict[str, int]]:
        """Open and validate each report; a bad report is counted by reason, never fails the batch."""
        contents, rejects = [], {}
        for p in payloads:
            reason = "malformed"
            try:
                c = envelope.open_payload(p)
                reason = "invalid"
                self._validate(c)
            except LacError as exc:
                rejects[reason] = rejects.get(reason, 0) + 1
                log.warning("rejected a report (%s): %s", reason, exc)
                continue
            contents.append(c)
        return contents, rejects

    async def ingest(self, request: curator_pb2.IngestBatchRequest) -> curator_pb2.IngestBatchResponse:
        if not request.batch_id or len(request.batch_id) > 128:
            raise InvalidArgument("batch_id must be 1..128 characters")
        if await self._run(self.store.has_batch, request.batch_id):
            return curator_pb2.IngestBatchResponse(batch_id=request.batch_id, duplicate=True)
        contents, rejects = self.open_batch(request.reports)
        accepted, rejected = await self._run(self.store.add_batch, request.batch_id, contents, rejects)
        log.info("stored batch %s: %d accepted, %d rejected", request.batch_id, accepted, rejected)
        return curator_pb2.IngestBatchResponse(batch_id=request.batch_id, accepted=accepted, rejected=rejected)

    async def release(self, request: curator_pb2.ReleaseRequest) -> curator_pb2.ReleaseRecord:
        params = bayesian_params(request)
        reports = await self._run(lambda: list(self.store.reports()))
        result = await asyncio.to_thread(compute_release, reports, self.vocab, params,
                                         self.config.max_items_per_report)
        record = curator_pb2.ReleaseRecord(
            release_id=uuid.uuid4().hex, created_at=dt.datetime.now(dt.timezone.utc).isoformat(),
            mechanism="bayesian", params={k: float(v) for k, v in asdict(params).items()
                                          if isinstance(v, (int, float))} | {"W": self.config.max_items_per_report},
            sensitivity_method=result.sensitivity_method, data_dependent=result.data_dependent,
            gamma=result.gamma, sigma=result.sigma, calibration=result.calibration, epsilon=params.epsilon,
            delta=params.delta, n_reports=result.n_users, vocab_size=result.vocab_size, max_n=self.vocab.max_n,
            statement=result.statement)
        await self._run(self.store.add_release, record, result.log_theta, result.mean)
        log.info("release %s: eps=%g delta=%g gamma=%g sigma=%g over %d reports", record.release_id,
                 record.epsilon, record.delta, record.gamma, record.sigma, record.n_reports)
        return record

    async def list_releases(self) -> list[curator_pb2.ReleaseRecord]:
        return await self._run(self.store.releases)

    async def get_release(self, release_id: str):
        found = await self._run(self.store.release, release_id)
        if found is None:
            raise NotFound(f"no release {release_id!r}")
        return found

    async def top_ngrams(self, release_id: str, k: int, order: int) -> list[tuple[str, float]]:
        _, log_probs, _ = await self.get_release(release_id)
        probs = np.exp(log_probs)
        if order:
            mask = self.vocab.orders == order
            if not mask.any():
                raise InvalidArgument(f"no {order}-grams in the release vocabulary (max_n={self.vocab.max_n})")
            probs = np.where(mask, probs, 0.0)
            probs = probs / probs.sum()
        k = min(k or 10, probs.size)
        top = np.argpartition(-probs, k - 1)[:k]
        top = top[np.argsort(-probs[top], kind="stable")]
        return [(self.vocab.items[i], float(probs[i])) for i in top]

    async def status(self) -> curator_pb2.CuratorStatus:
        counts = await self._run(self.store.counts)
        return curator_pb2.CuratorStatus(batches=counts["batches"], reports=counts["reports"],
                                         releases=counts["releases"], rejects=await self._run(self.store.rejects))
