"""Proto ⇄ domain translations of the curator's RPCs (the only curator module that builds replies).

Views by role: an analyst's reply never carries an exact count, a pre-noise value or, for a
data-dependent release, its data-derived sensitivity and noise scale; an operator's does (except
pre-noise values, which no reply carries).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from google.protobuf.message import DecodeError

from lac.common.errors import InvalidArgument
from lac.common.privacy import Budget, LocalGuarantee, check_delta
from lac.common.rpc import LENGTH_DELIMITED, Caller, Role, fields
from lac.common.serde import local_guarantee_message
from lac.common.v1 import curator_pb2, reports_pb2
from lac.curator import mechanisms
from lac.curator.mechanisms import ReleaseSpec
from lac.curator.runner.preview import Preview
from lac.curator.runner.run import ReleaseRecord
from lac.curator.store.ingest import IngestBatch

__all__ = [
    "ingest_batch",
    "release_spec",
    "request_id",
    "top_k",
    "record_message",
    "preview_message",
    "window_budgets",
    "export_windows",
    "export_header",
    "export_records",
    "exports_per_window",
    "is_operator",
    "EPSILON_RANGE",
    "MIN_DELTA",
    "PURE_MECHANISMS",
    "DEFAULT_TOP_K",
]

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
    if statement is not None:
        statement.DiscardUnknownFields()
    return IngestBatch(name, payloads, statement)


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
    if (r.s or r.rho) and not {"S", "rho"} <= mechanisms.get(spec.mechanism).knobs:
        raise InvalidArgument(f"S and rho apply to {' and '.join(mechanisms.with_knob('S'))} only")
    return spec


def top_k(r: curator_pb2.TopNgramsRequest) -> int:
    """How many n-grams a TopNgrams request asks for: unset, ``DEFAULT_TOP_K`` (what older clients' k = 0
    always meant); an explicit 0 is refused with InvalidArgument rather than read as 10."""
    if not r.HasField("k"):
        return DEFAULT_TOP_K
    if r.k < 1:
        raise InvalidArgument("k must be at least 1 (how many n-grams to list), got 0")
    return r.k


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


def export_windows(r: curator_pb2.ExportReportsRequest) -> tuple[int, int]:
    """The windows an export asks for; InvalidArgument unless both are given."""
    if not (r.HasField("first_window") and r.HasField("last_window")):
        raise InvalidArgument(
            "give first_window and last_window (equal for one window) of the closed windows to export"
        )
    return int(r.first_window), int(r.last_window)


def export_header(export_id: str, g: LocalGuarantee) -> curator_pb2.ExportChunk:
    """The first message of an export: its id and guarantee."""
    return curator_pb2.ExportChunk(export_id=export_id, guarantee=local_guarantee_message(g))


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
