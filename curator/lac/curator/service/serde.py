"""Proto ⇄ domain translations of the curator's RPCs: every generated message the curator reads or builds (the
servicers of ``lac.curator.service.server`` parse with it, call one handler and reply with it).

Views by role: an analyst's reply never carries an exact count, a pre-noise value or, for a
data-dependent release, its data-derived sensitivity and noise scale; an operator's does (except
pre-noise values, which no reply carries).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from google.protobuf.message import DecodeError

from lac.common.deployment import Deployment
from lac.common.errors import InvalidArgument
from lac.common.privacy import ERROR_BAR_LEVEL, Budget, check_delta
from lac.common.rpc import LENGTH_DELIMITED, Caller, Role, fields
from lac.common.serde import deployment_to_proto, local_guarantee_message
from lac.common.v1 import curator_pb2, reports_pb2
from lac.common.version import server_version
from lac.curator import mechanisms
from lac.curator.ingest.chunks import BatchStatement, IngestBatch
from lac.curator.mechanisms import ReleaseSpec
from lac.curator.runner.preview import Preview
from lac.curator.runner.run import ReleaseRecord
from lac.curator.service.handlers.exports import Export
from lac.curator.service.handlers.ingest import Ingested
from lac.curator.service.handlers.query import NextWords, Perplexity, TopNgrams
from lac.curator.service.handlers.release import StoredRelease
from lac.curator.service.handlers.status import BudgetStatus, Status

__all__ = [
    "SERVICE_NAMES",
    "ingest_batch",
    "batch_statement",
    "ingest_message",
    "release_spec",
    "request_id",
    "top_k",
    "record_message",
    "releases_message",
    "release_message",
    "preview_message",
    "budget_message",
    "status_message",
    "deployment_message",
    "probabilities_message",
    "next_word_message",
    "perplexity_message",
    "arpa_messages",
    "window_budgets",
    "export_windows",
    "export_messages",
    "export_records",
    "exports_per_window",
    "is_operator",
    "EPSILON_RANGE",
    "MIN_DELTA",
    "PURE_MECHANISMS",
    "DEFAULT_TOP_K",
]

SERVICE_NAMES = [s.full_name for s in curator_pb2.DESCRIPTOR.services_by_name.values()]
ARPA_CHUNK_CHARS = 1 << 20
# What a request over RPC may ask for: beyond these the mechanisms' arithmetic breaks down (a noise
# scale that overflows, a calibration with no root) long after the result stopped being useful.
EPSILON_RANGE = (1e-6, 1e6)
MIN_DELTA = 1e-100
# The mechanisms that spend no δ, so the only ones a request with δ = 0 may name.
PURE_MECHANISMS = tuple(m for m in mechanisms.over_rpc() if not mechanisms.get(m).with_delta)
MAX_REQUEST_ID_CHARS = 128
# The k of a TopNgramsRequest without one (k had no presence before: a client's k = 0 arrived unset).
DEFAULT_TOP_K = 10


_INGEST = curator_pb2.IngestBatchRequest.DESCRIPTOR.fields_by_name
_BATCH_ID, _REPORTS, _PRIVACY = (_INGEST[name].number for name in ("batch_id", "reports", "privacy"))


def ingest_batch(raw: bytes, max_reports: int) -> IngestBatch:
    """A serialized ``IngestBatchRequest`` scanned once (``lac.common.rpc.fields``): each report's bytes are
    cut out, not parsed (the ingest workers parse and open each one, and quarantine one that is not a
    ``SealedPayload``). InvalidArgument for bytes that are not such a request or that hold more than
    ``max_reports`` reports (counted as they are scanned). Unknown fields are skipped, as the parser would."""
    batch_id = b""
    payloads: list[bytes] = []
    privacy: list[bytes] = []  # the statement's pieces (a message repeated on the wire is merged)
    try:
        for number, wire, start, end in fields(raw):
            if wire != LENGTH_DELIMITED:
                continue
            if number == _REPORTS:
                if len(payloads) == max_reports:
                    raise InvalidArgument(
                        f"more than {max_reports} reports in one batch; at most {max_reports} (max_reports_per_batch)"
                    )
                payloads.append(raw[start:end])
            elif number == _BATCH_ID:
                batch_id = raw[start:end]
            elif number == _PRIVACY:
                privacy.append(raw[start:end])
        statement = reports_pb2.BatchPrivacy.FromString(b"".join(privacy)) if privacy else None
        name = batch_id.decode()
    except (ValueError, DecodeError):  # a UnicodeDecodeError is a ValueError
        raise InvalidArgument("malformed IngestBatchRequest (not a valid protobuf message)") from None
    if statement is None:
        return IngestBatch(name, payloads, None)
    statement.DiscardUnknownFields()
    return IngestBatch(name, payloads, batch_statement(statement))


def batch_statement(p: reports_pb2.BatchPrivacy) -> BatchStatement:
    """The shuffler's statement about a batch, as ingest reads it (``encoded``: the message, for the store)."""
    return BatchStatement(
        reports_per_window=int(p.reports_per_window),
        window_seconds=float(p.window_seconds),
        windows_per_period=int(p.windows_per_period),
        period_seconds=float(p.period_seconds),
        distinct_clients=bool(p.distinct_clients),
        first_window=int(p.first_window),
        last_window=int(p.last_window),
        statement=p.statement,
        encoded=p.SerializeToString(),
    )


def ingest_message(r: Ingested) -> curator_pb2.IngestBatchResponse:
    """IngestBatch's reply."""
    if r.duplicate:
        return curator_pb2.IngestBatchResponse(batch_id=r.batch_id, duplicate=True)
    return curator_pb2.IngestBatchResponse(batch_id=r.batch_id, accepted=r.accepted, rejected=r.rejected)


def is_operator(caller: Caller) -> bool:
    return Role.OPERATOR in caller.roles


def release_spec(r: curator_pb2.ReleaseRequest) -> ReleaseSpec:
    """The request as a ``ReleaseSpec`` (unset fields take the spec's defaults); InvalidArgument if invalid."""
    given: dict[str, Any] = {}  # keyword arguments of ReleaseSpec
    if r.mechanism:
        given["mechanism"] = r.mechanism
    if r.HasField("delta"):  # unset: the spec's default; an explicit 0 is δ = 0
        mechanism = given.get("mechanism", ReleaseSpec.mechanism)
        if mechanism in PURE_MECHANISMS:  # δ is not theirs to spend, but a δ asked for must be one
            try:
                check_delta(r.delta)
            except ValueError as exc:
                raise InvalidArgument(str(exc)) from None
        elif r.delta == 0 and mechanism in mechanisms.over_rpc():
            raise InvalidArgument(
                f"delta = 0 is pure ε-DP, which mechanism {mechanism!r} cannot give (its Gaussian noise needs "
                f"delta > 0; leave delta unset for the default {ReleaseSpec.delta:g}); pure ε-DP mechanisms: "
                f"{', '.join(PURE_MECHANISMS)}"
            )
        given["delta"] = r.delta
    if r.s:
        given["S"] = r.s
    if r.rho:
        given["rho"] = r.rho
    for name in ("sensitivity", "calibration", "public_sensitivity"):
        if getattr(r, name):
            given[name] = getattr(r, name)
    if r.HasField("discovery"):
        given["discovery"] = r.discovery
    if r.force:
        given["force"] = True
    if r.expected_reports:
        given["expected_reports"] = r.expected_reports
    if r.HasField("first_window") or r.HasField("last_window"):
        given["first_window"] = r.first_window if r.HasField("first_window") else None
        given["last_window"] = r.last_window if r.HasField("last_window") else None
    try:
        spec = ReleaseSpec(epsilon=r.epsilon, **given)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    if not mechanisms.get(spec.mechanism).over_rpc:
        raise InvalidArgument(
            f"mechanism {spec.mechanism!r} is not available over RPC; available: {', '.join(mechanisms.over_rpc())}"
        )
    lo, hi = EPSILON_RANGE
    if not lo <= spec.epsilon <= hi:
        raise InvalidArgument(f"epsilon must be in [{lo:g}, {hi:g}] over RPC, got {spec.epsilon!r}")
    if spec.budget.delta and spec.delta < MIN_DELTA:
        raise InvalidArgument(f"delta must be in [{MIN_DELTA:g}, 1) over RPC, got {spec.delta!r}")
    knobs = mechanisms.get(spec.mechanism).knobs
    if (r.s or r.rho) and not {"S", "rho"} <= knobs:
        raise InvalidArgument(f"S and rho apply to {' and '.join(mechanisms.with_knob('S'))} only")
    if r.HasField("discovery") and "discovery" not in knobs:
        raise InvalidArgument(f"discovery applies to {' and '.join(mechanisms.with_knob('discovery'))} only")
    return spec


def top_k(r: curator_pb2.TopNgramsRequest) -> int:
    """How many n-grams a TopNgrams request asks for: unset, ``DEFAULT_TOP_K`` (what older clients' k = 0
    always meant); an explicit 0 is refused with InvalidArgument rather than read as 10."""
    if not r.HasField("k"):
        return DEFAULT_TOP_K
    if r.k < 1:
        raise InvalidArgument("k must be at least 1 (how many n-grams to list), got 0")
    return r.k


def top_level(r: curator_pb2.TopNgramsRequest) -> float:
    """The coverage a TopNgrams request asks its intervals for: unset, ``ERROR_BAR_LEVEL`` (0.9); InvalidArgument
    outside (0, 1)."""
    if not r.HasField("level"):
        return ERROR_BAR_LEVEL
    if not 0 < r.level < 1:  # NaN too
        raise InvalidArgument(f"level must be in (0, 1) (the intervals' coverage, e.g. 0.9), got {r.level!r}")
    return r.level


def top_message(top: TopNgrams) -> curator_pb2.TopNgramsResponse:
    """TopNgrams' reply: each n-gram with its probability and error bar (left unset where it is NaN: none)."""
    ngrams = []
    for g, p, sd, low, high in top.rows:
        bar = {} if math.isnan(sd) else {"noise_sd": sd, "noise_low": low, "noise_high": high}
        ngrams.append(curator_pb2.NgramProbability(ngram=g, probability=p, **bar))
    return curator_pb2.TopNgramsResponse(ngrams=ngrams, level=top.level, error_bars=top.described)


def probabilities_message(found: list[tuple[str, float]]) -> curator_pb2.NgramProbabilitiesResponse:
    """NgramProbabilities' reply."""
    return curator_pb2.NgramProbabilitiesResponse(
        ngrams=[curator_pb2.NgramProbability(ngram=g, probability=p) for g, p in found]
    )


def next_word_message(n: NextWords) -> curator_pb2.NextWordResponse:
    """NextWord's reply."""
    return curator_pb2.NextWordResponse(
        context_used=n.context_used, words=[curator_pb2.NgramProbability(ngram=w, probability=p) for w, p in n.words]
    )


def perplexity_message(p: Perplexity) -> curator_pb2.PerplexityResponse:
    """Perplexity's reply."""
    return curator_pb2.PerplexityResponse(
        perplexity=p.perplexity,
        n_sentences=p.n_sentences,
        n_tokens=p.n_tokens,
        n_out_of_vocabulary=p.n_out_of_vocabulary,
    )


def arpa_messages(text: str) -> Iterator[curator_pb2.ArpaChunk]:
    """ExportArpa's replies: the text in chunks of ``ARPA_CHUNK_CHARS`` characters."""
    for i in range(0, len(text), ARPA_CHUNK_CHARS):
        yield curator_pb2.ArpaChunk(text=text[i : i + ARPA_CHUNK_CHARS])


def request_id(r: curator_pb2.ReleaseRequest) -> str | None:
    """The request's client-chosen id (None: unset); InvalidArgument unless 1..128 printable characters."""
    rid = r.request_id
    if not rid:
        return None
    if len(rid) > MAX_REQUEST_ID_CHARS or not rid.isprintable():
        raise InvalidArgument(f"request_id must be 1..{MAX_REQUEST_ID_CHARS} printable characters")
    return rid


def record_message(rec: ReleaseRecord, caller: Caller) -> curator_pb2.ReleaseRecord:
    """The caller's view of a release record."""
    operator = is_operator(caller)
    show_noise = operator or not rec.data_dependent
    return curator_pb2.ReleaseRecord(
        release_id=rec.release_id,
        created_at=rec.created_at,
        mechanism=rec.mechanism,
        params=rec.params,
        sensitivity_method=rec.sensitivity_method,
        data_dependent=rec.data_dependent,
        gamma=rec.gamma if show_noise else 0.0,
        sigma=rec.sigma if show_noise else 0.0,
        calibration=rec.calibration,
        epsilon=rec.epsilon,
        delta=rec.delta,
        n_reports=rec.n_reports if operator else 0,
        vocab_size=rec.vocab_size,
        max_n=rec.max_n,
        statement=rec.statement if operator else rec.public_statement,
        differentially_private=rec.differentially_private,
        laplace_scale=rec.laplace_scale if show_noise else 0.0,
        ledger_epsilon=rec.charged_epsilon,
        ledger_delta=rec.charged_delta,
        first_window=rec.first_window,
        last_window=rec.last_window,
        privacy_unit=rec.privacy_unit,
        reports_per_user=rec.reports_per_user,
        discovery_threshold=rec.threshold,
        discovered=rec.discovered,
        request_id=rec.request_id,
        error_bars=rec.bars.statement() if rec.bars is not None else "",
    )


def releases_message(records: list[ReleaseRecord], caller: Caller) -> curator_pb2.ListReleasesResponse:
    """ListReleases' reply: each record as ``caller`` may see it."""
    return curator_pb2.ListReleasesResponse(releases=[record_message(r, caller) for r in records])


def release_message(r: StoredRelease, caller: Caller) -> curator_pb2.GetReleaseResponse:
    """GetRelease's reply: the record as ``caller`` may see it, the items and their released values."""
    return curator_pb2.GetReleaseResponse(
        record=record_message(r.record, caller),
        items=r.items,
        log_probs=r.log_probs.tolist(),
        pseudo_counts=[] if r.pseudo_counts is None else r.pseudo_counts.tolist(),
    )


def preview_message(p: Preview) -> curator_pb2.ReleasePreview:
    """A preview holds public information and what the caller may know: the same for every role."""
    optional: dict[str, Any] = {
        k: v
        for k, v in (
            ("reports", p.reports),
            ("signal_share", p.signal_share),
            ("swamped", p.swamped),
            ("reports_needed", p.reports_needed),
            ("epsilon_needed", p.epsilon_needed),
            ("channel_progress", p.channel_progress),
        )
        if v is not None
    }
    return curator_pb2.ReleasePreview(
        mechanism=p.mechanism,
        epsilon=p.epsilon,
        delta=p.delta,
        noise=p.noise,
        noise_unit=p.noise_unit,
        reports_source=p.reports_source,
        resolvable=list(p.resolvable),
        target_share=p.target_share,
        advice=p.advice,
        statement=p.statement(),
        channel_status=p.channel_status,
        budget_after=[
            curator_pb2.WindowBudget(
                window=w, spent_epsilon=e, spent_delta=d, remaining_epsilon=e_left, remaining_delta=d_left
            )
            for w, e, d, e_left, d_left in p.budget_after
        ],
        **optional,
    )


def window_budgets(
    spent: dict[int, Budget], limit: Budget, exports: Mapping[int, int] | None = None
) -> list[curator_pb2.WindowBudget]:
    """The budget of each window of ``spent``, with the number of exports of its reports (``exports``)."""
    out = []
    for w in sorted(spent):
        left = limit.minus(spent[w])
        out.append(
            curator_pb2.WindowBudget(
                window=w,
                spent_epsilon=spent[w].epsilon,
                spent_delta=spent[w].delta,
                remaining_epsilon=left.epsilon,
                remaining_delta=left.delta,
                exports=(exports or {}).get(w, 0),
            )
        )
    return out


def budget_message(b: BudgetStatus, caller: Caller) -> curator_pb2.BudgetStatus:
    """GetBudget's reply: each window's budget with its exports, and the exports as ``caller`` may see them."""
    return curator_pb2.BudgetStatus(
        budget_epsilon=b.budget.epsilon,
        budget_delta=b.budget.delta,
        windows=window_budgets(b.spent, b.budget, exports_per_window(b.exports)),
        window_seconds=b.window_seconds,
        reports_per_window=b.reports_per_window,
        exports=export_records(b.exports, caller),
    )


def status_message(s: Status) -> curator_pb2.CuratorStatus:
    """GetStatus' reply (operators only: exact counts)."""
    return curator_pb2.CuratorStatus(
        batches=s.batches,
        reports=s.reports,
        releases=s.releases,
        rejects=s.rejects,
        quarantined=s.quarantined,
        budget_epsilon=s.budget.epsilon,
        budget_delta=s.budget.delta,
        replay_window_days=s.replay_window_days,
        windows=window_budgets(s.spent, s.budget),
        reports_by_window=s.reports_by_window,
    )


def deployment_message(d: Deployment) -> reports_pb2.Deployment:
    """GetDeployment's reply, with this server's version."""
    return deployment_to_proto(d, server_version=server_version("curator"))


def export_windows(r: curator_pb2.ExportReportsRequest) -> tuple[int, int]:
    """The windows an export asks for; InvalidArgument unless both are given."""
    if not (r.HasField("first_window") and r.HasField("last_window")):
        raise InvalidArgument(
            "give first_window and last_window (equal for one window) of the closed windows to export"
        )
    return int(r.first_window), int(r.last_window)


async def export_messages(made: Export, chunks: AsyncIterator[bytes]) -> AsyncIterator[curator_pb2.ExportChunk]:
    """ExportReports' replies: first the export's id and guarantee, then its rows' Arrow IPC ``chunks``."""
    yield curator_pb2.ExportChunk(export_id=made.export_id, guarantee=local_guarantee_message(made.guarantee))
    async for data in chunks:
        yield curator_pb2.ExportChunk(arrow_ipc=data)


def _rfc3339(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix, dt.UTC).isoformat(timespec="seconds")


def export_records(rows: list[tuple[str, str, float, int, int, int]], caller: Caller) -> list[curator_pb2.ExportRecord]:
    """The ledger's exports (``CuratorStore.exports``) as ``caller`` may see them: an export's row count (exact,
    from the data) only for operators and for the identity that exported."""
    me = (caller.identity or "").removeprefix("mtls:")
    return [
        curator_pb2.ExportRecord(
            export_id=e,
            identity=who,
            exported_at=_rfc3339(at),
            first_window=a,
            last_window=b,
            rows=n if is_operator(caller) or (me and me == who) else None,
        )
        for e, who, at, a, b, n in rows
    ]


def exports_per_window(rows: list[tuple[str, str, float, int, int, int]]) -> dict[int, int]:
    """How many exports covered each window."""
    out: dict[int, int] = {}
    for _, _, _, a, b, _ in rows:
        for w in range(a, b + 1):
            out[w] = out.get(w, 0) + 1
    return out
