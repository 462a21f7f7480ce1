"""The curator service: idempotent batch ingest with quarantine and a replay window, releases
charged to a privacy ledger, and free queries on releases (library behind the servicer).

Ingest rules
------------
* A batch is identified by its ``batch_id``: a redelivered batch is acknowledged as a duplicate
  and stored once.
* Every payload is opened in ``Curator._open`` and validated. A report that cannot be opened or
  is invalid is quarantined (sealed bytes, reason, detail) and counted by reason; it never fails
  the batch. Reasons come from the envelope's error (``reason`` attribute, default "malformed")
  or are "invalid" (validation) / "internal" (an unexpected error while opening).
* A report id already seen within ``replay_window_days`` (or twice in one batch) is counted as
  "replayed_report_id" and dropped, not quarantined (its first copy is stored; keeping replays
  would let a replayer fill the disk). Older ids are forgotten: the window bounds the state.
* The batch (segment file + metadata) is committed durably before the reply is sent.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
import scipy.sparse as sp

from lac.common import envelope
from lac.common.errors import FailedPrecondition, InvalidArgument, LacError, NotFound
from lac.common.text import sentences as split_sentences
from lac.common.v1 import curator_pb2, reports_pb2
from lac.curator.bayesian import BayesianParams, BayesianRelease, bayesian_dp
from lac.curator.config import CuratorConfig
from lac.curator.lm import NgramModel
from lac.curator.ngrams import NgramVocabulary, cap_and_clamp, count_reports, user_counts
from lac.curator.offline import MECHANISMS, run_mechanism
from lac.curator.store import CuratorStore, Quarantined, Segment

log = logging.getLogger(__name__)

_MAX_REASON = 64
_MAX_DETAIL = 500
ARPA_CHUNK_CHARS = 1 << 20
_DP_DELTA_MECHANISMS = ("bayesian", "endtoend")


def compute_release(reports, vocab: NgramVocabulary, params: BayesianParams, max_items_per_report: int,
                    rng: np.random.Generator | None = None) -> BayesianRelease:
    """BayesianDP over per-report n-gram counts: the whole release computation, server or not."""
    counts = user_counts(reports, vocab, C=int(params.C), W=max_items_per_report)
    return bayesian_dp(counts, vocab.alpha, params, rng)


def make_segment(reports: list[list[list[str]]], vocab: NgramVocabulary) -> Segment:
    """Raw per-report counts of ``reports`` over ``vocab`` as a segment with local item strings."""
    raw = count_reports(reports, vocab, C=None, W=None).matrix
    cols, local = np.unique(raw.indices, return_inverse=True)
    return Segment(tuple(vocab.items[c] for c in cols.tolist()), raw.indptr.astype(np.int64),
                   local.astype(np.int32).reshape(-1), raw.data.astype(np.int32))


def segment_counts(segments, vocab: NgramVocabulary, C: int, W: int | None) -> sp.csr_matrix:
    """Per-report counts over ``vocab`` (W cap, C clamp) from stored segments; equals
    ``user_counts`` of the original reports. Items no longer in ``vocab`` are dropped first."""
    index = vocab.index
    parts = []
    for seg in segments:
        to_col = np.fromiter((index.get(it, -1) for it in seg.items), dtype=np.int64, count=len(seg.items))
        cols = to_col[seg.indices] if seg.indices.size else np.empty(0, np.int64)
        parts.append(cap_and_clamp(seg.indptr, cols, seg.data, len(vocab), C, W))
    if not parts:
        return sp.csr_matrix((0, len(vocab)), dtype=np.int32)
    out = sp.vstack(parts, format="csr")
    out.indices = out.indices.astype(np.int32, copy=False)
    return out


def _record_params(params: dict, W: int) -> dict[str, float]:
    out = {k: float(v) for k, v in params.items()
           if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None}
    out["W"] = float(W)
    return out


class Curator:
    def __init__(self, config: CuratorConfig, vocab: NgramVocabulary, rng: np.random.Generator | None = None):
        self.config = config
        self.vocab = vocab
        self.store = CuratorStore(config.state_dir, config.quarantine_max_rows)
        self._rng = rng  # None: a fresh CSPRNG generator per release (production)
        self.keyring = envelope.CuratorKeyRing.load(config.key_dir) if config.key_dir else None
        if config.allow_plaintext_payloads:
            log.warning("INSECURE: accepting plaintext payloads (local demos and tests only)")
        if self.keyring is None:
            log.warning("no key ring (key_dir): every HPKE-sealed report will be quarantined as unknown_key")
        self._db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="curator-store")
        self._models: OrderedDict[str, NgramModel] = OrderedDict()
        self._model_lock = asyncio.Lock()

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._db, fn, *args)

    async def stop(self) -> None:
        await self._run(self.store.close)
        self._db.shutdown()

    @property
    def budget(self) -> tuple[float, float]:
        return self.config.budget_epsilon, self.config.budget_delta

    # -- ingest -------------------------------------------------------------------------------

    def _open(self, sealed: reports_pb2.SealedPayload) -> reports_pb2.ReportContent:
        """The one place payloads are opened."""
        return envelope.open_payload(sealed, self.keyring, allow_plaintext=self.config.allow_plaintext_payloads)

    def _validate(self, content: reports_pb2.ReportContent) -> None:
        cfg = self.config
        if len(content.report_id) != envelope.REPORT_ID_BYTES:
            raise InvalidArgument(f"report_id must be {envelope.REPORT_ID_BYTES} bytes")
        if len(content.sentences) > cfg.max_sentences_per_report:
            raise InvalidArgument(f"{len(content.sentences)} sentences; at most {cfg.max_sentences_per_report}")
        for s in content.sentences:
            for t in s.tokens:
                if not t or len(t) > cfg.max_token_chars or len(t.split()) != 1 or t.strip() != t:
                    raise InvalidArgument(f"token {t[:80]!r}: must be 1..{cfg.max_token_chars} characters, "
                                          "no whitespace")

    def open_batch(self, payloads) -> tuple[list[bytes], list[list[list[str]]], list[Quarantined]]:
        """Open and validate each report: (report ids, sentences) of the good ones, and the
        quarantined others with their reason. Never raises for a bad report."""
        ids, texts, quarantined = [], [], []
        for p in payloads:
            try:
                try:
                    c = self._open(p)
                except LacError as exc:
                    raise _Reject(str(getattr(exc, "reason", "malformed")), exc) from None
                except Exception as exc:  # a bug or library error must not take the batch down
                    log.exception("unexpected error opening a report")
                    raise _Reject(str(getattr(exc, "reason", "internal")), exc) from None
                try:
                    self._validate(c)
                except LacError as exc:
                    raise _Reject("invalid", exc) from None
            except _Reject as r:
                reason = r.reason[:_MAX_REASON] or "malformed"
                log.warning("quarantined a report (%s): %s", reason, r.exc)
                quarantined.append(Quarantined(reason, str(r.exc)[:_MAX_DETAIL], p.SerializeToString()))
                continue
            ids.append(bytes(c.report_id))
            texts.append([list(s.tokens) for s in c.sentences])
        return ids, texts, quarantined

    async def ingest(self, request: curator_pb2.IngestBatchRequest) -> curator_pb2.IngestBatchResponse:
        if not request.batch_id or len(request.batch_id) > 128:
            raise InvalidArgument("batch_id must be 1..128 characters")
        if await self._run(self.store.has_batch, request.batch_id):
            return curator_pb2.IngestBatchResponse(batch_id=request.batch_id, duplicate=True)
        ids, texts, quarantined = await asyncio.to_thread(self.open_batch, request.reports)
        window = self.config.replay_window_days * 86400.0
        privacy = request.privacy.SerializeToString() if request.HasField("privacy") else None
        result = await self._run(partial(
            self.store.add_batch, request.batch_id, ids, lambda keep: make_segment([texts[i] for i in keep], self.vocab),
            quarantined, window, privacy=privacy))
        if result.duplicate:
            return curator_pb2.IngestBatchResponse(batch_id=request.batch_id, duplicate=True)
        log.info("stored batch %s: %d accepted, %d rejected %s; shuffler: %s", request.batch_id, result.accepted,
                 result.rejected, result.rejects or "", request.privacy.statement or "no amplification statement")
        return curator_pb2.IngestBatchResponse(batch_id=request.batch_id, accepted=result.accepted,
                                               rejected=result.rejected)

    def counts(self, C: int) -> sp.csr_matrix:
        """Per-report counts of everything stored, W from the config, clamped at C."""
        return segment_counts(self.store.segments(), self.vocab, C, self.config.max_items_per_report)

    # -- releases -----------------------------------------------------------------------------

    def _release_args(self, r: curator_pb2.ReleaseRequest) -> tuple[str, dict]:
        mechanism = r.mechanism or "bayesian"
        if mechanism not in MECHANISMS:
            raise InvalidArgument(f"unknown mechanism {mechanism!r}; available: {', '.join(MECHANISMS)}")
        if mechanism == "kanon" and not self.config.allow_non_dp_releases:
            raise FailedPrecondition("mechanism 'kanon' (k-anonymity) is NOT differentially private and is "
                                     "disabled; the operator can enable it with allow_non_dp_releases")
        if r.sensitivity and r.sensitivity not in ("bruteforce", "claim1", "sound"):
            raise InvalidArgument(f"unknown sensitivity {r.sensitivity!r}")
        if r.public_sensitivity and r.public_sensitivity not in ("sound", "observed"):
            raise InvalidArgument(f"unknown public_sensitivity {r.public_sensitivity!r}")
        return mechanism, dict(
            S=r.s or None, C=r.c or None, rho=r.rho or None, sensitivity=r.sensitivity or "bruteforce",
            calibration=r.calibration or "auto", W=self.config.max_items_per_report,
            n_max=int(r.n_max or self.config.n_max) if r.sensitivity == "sound" else None, K=int(r.k or 50),
            public_sensitivity=r.public_sensitivity or "sound")

    async def release(self, request: curator_pb2.ReleaseRequest) -> curator_pb2.ReleaseRecord:
        mechanism, kw = self._release_args(request)
        dp = mechanism != "kanon"
        if dp:
            if not (math.isfinite(request.epsilon) and request.epsilon > 0):
                raise InvalidArgument(f"epsilon must be finite and > 0, got {request.epsilon!r}")
            want = (request.epsilon, request.delta if mechanism in _DP_DELTA_MECHANISMS else 0.0)
            await self._run(self.store.check_budget, *want, self.budget)  # fail fast; re-checked at commit
        C = int(kw["C"] or BayesianParams(epsilon=1.0, delta=0.5).C)
        U = await self._run(self.counts, C)
        log_probs, mean, rec = await asyncio.to_thread(run_mechanism, U, self.vocab.alpha, mechanism,
                                                       request.epsilon, request.delta, rng=self._rng, **kw)
        eps = rec.get("epsilon")
        spend = (float(eps), float(rec.get("delta") or 0.0)) if dp else None
        record = curator_pb2.ReleaseRecord(
            release_id=uuid.uuid4().hex, created_at=dt.datetime.now(dt.timezone.utc).isoformat(),
            mechanism=mechanism, params=_record_params(rec.get("params") or {}, self.config.max_items_per_report),
            sensitivity_method=rec.get("sensitivity_method") or "", data_dependent=bool(rec.get("data_dependent")),
            gamma=rec.get("gamma") or 0.0, sigma=rec.get("sigma") or 0.0, calibration=rec.get("calibration") or "",
            epsilon=math.inf if eps is None else float(eps), delta=float(rec.get("delta") or 0.0),
            n_reports=int(rec["n_users"]), vocab_size=int(rec["vocab_size"]), max_n=self.vocab.max_n,
            statement=rec["statement"], differentially_private=bool(rec.get("differentially_private", True)),
            laplace_scale=rec.get("laplace_scale") or 0.0,
            ledger_epsilon=spend[0] if spend else 0.0, ledger_delta=spend[1] if spend else 0.0)
        await self._run(self.store.add_release, record, self.vocab.items, log_probs, mean, spend, self.budget)
        log.info("release %s (%s): eps=%g delta=%g over %d reports%s", record.release_id, mechanism,
                 record.epsilon, record.delta, record.n_reports, "" if dp else " — NOT differentially private")
        return record

    # -- queries (post-processing: free) --------------------------------------------------------

    async def list_releases(self) -> list[curator_pb2.ReleaseRecord]:
        return await self._run(self.store.releases)

    async def get_release(self, release_id: str):
        """(record, items, log_probs, pre-noise mean) or NotFound."""
        found = await self._run(self.store.release, release_id) if release_id else None
        if found is None:
            raise NotFound(f"no release {release_id!r}")
        return found

    async def model(self, release_id: str) -> NgramModel:
        async with self._model_lock:
            if release_id in self._models:
                self._models.move_to_end(release_id)
                return self._models[release_id]
            record, items, log_probs, _ = await self.get_release(release_id)
            m = await asyncio.to_thread(NgramModel, items, log_probs, record.max_n or self.vocab.max_n)
            self._models[release_id] = m
            while len(self._models) > 4:
                self._models.popitem(last=False)
            return m

    async def top_ngrams(self, release_id: str, k: int, order: int) -> list[tuple[str, float]]:
        record, items, log_probs, _ = await self.get_release(release_id)
        if order and not 1 <= order <= record.max_n:
            raise InvalidArgument(f"order must be 0 (any) or 1..{record.max_n}, got {order}")
        probs = np.exp(log_probs)
        if order:
            mask = np.fromiter((it.count(" ") + 1 == order for it in items), dtype=bool, count=len(items))
            if not mask.any():
                raise InvalidArgument(f"no {order}-grams in the release vocabulary")
            probs = np.where(mask, probs, 0.0)
            probs = probs / probs.sum()  # the joint within the order, as NgramModel.prob
        k = min(k or 10, probs.size)
        top = np.argpartition(-probs, k - 1)[:k]
        top = top[np.argsort(-probs[top], kind="stable")]
        return [(items[i], float(probs[i])) for i in top]

    async def ngram_probabilities(self, release_id: str, ngrams: list[str]) -> list[tuple[str, float]]:
        m = await self.model(release_id)
        if not ngrams:
            raise InvalidArgument("give at least one n-gram")
        out = []
        for g in ngrams:
            n = len(g.split())
            if not 1 <= n <= m.max_n:
                raise InvalidArgument(f"n-gram {g[:80]!r}: must have 1..{m.max_n} tokens")
            out.append((" ".join(g.split()), m.prob(g)))
        return out

    async def next_word(self, release_id: str, context: str, k: int) -> tuple[str, list[tuple[str, float]]]:
        m = await self.model(release_id)
        return " ".join(m.context_used(context)), m.next_word(context, k or 10)

    async def perplexity(self, release_id: str, text: str) -> tuple[float, int, int, int]:
        m = await self.model(release_id)
        sents = split_sentences(text)
        if not sents:
            raise InvalidArgument("the text has no words")
        n_tokens = sum(len(s) + 1 for s in sents)
        oov = sum(w not in m.vocabulary for s in sents for w in s)
        return await asyncio.to_thread(m.perplexity, sents), len(sents), n_tokens, oov

    async def arpa(self, release_id: str) -> str:
        m = await self.model(release_id)
        return await asyncio.to_thread(m.arpa)

    async def status(self) -> curator_pb2.CuratorStatus:
        counts = await self._run(self.store.counts)
        spent_eps, spent_delta = await self._run(self.store.spent)
        b_eps, b_delta = self.budget
        return curator_pb2.CuratorStatus(
            batches=counts["batches"], reports=counts["reports"], releases=counts["releases"],
            rejects=await self._run(self.store.rejects), quarantined=counts["quarantined"],
            budget_epsilon=b_eps, budget_delta=b_delta, spent_epsilon=spent_eps, spent_delta=spent_delta,
            remaining_epsilon=max(b_eps - spent_eps, 0.0), remaining_delta=max(b_delta - spent_delta, 0.0),
            replay_window_days=self.config.replay_window_days)


class _Reject(Exception):
    def __init__(self, reason: str, exc: BaseException):
        super().__init__(reason)
        self.reason, self.exc = reason, exc
