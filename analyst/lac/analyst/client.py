"""The analyst's Python API: releases and queries of a curator as pandas DataFrames (or Arrow tables).

Three lines from a running curator to a DataFrame of the top n-grams::

    from lac.analyst import CuratorClient
    with CuratorClient("localhost:50052", ca="ca.pem", cert="analyst.pem", key="analyst.key") as c:
        top = c.top(c.release(epsilon=1.0).release_id, k=20)

``CuratorClient`` is a thin, synchronous wrapper over the ``lac.v1.Curator`` gRPC service: every
number it returns is one the service returned (differentially private outputs and public
configuration). What an analyst may see is decided by the curator, per caller: an analyst's release
record carries no report count, and for a data-dependent release no sensitivity or noise scale, so
nothing here has a column for them.

Errors of the service arrive as ``AnalystError`` (``.status``: the gRPC status code, ``.code``: its name,
``.details``: the curator's message), or one of its subclasses, chosen by the status code (and, for the two
kinds of FAILED_PRECONDITION, the ``lac-error-reason`` trailing metadata the curator sends), never by the
message text: ``PermissionDenied``, ``NotFound``, ``InvalidArgument``, ``FailedPrecondition`` (and its
``BudgetExhausted``, ``ReleaseRefused``), ``ResourceExhausted``, ``Unavailable`` (and its ``ChannelNotReady``).
No raw gRPC exception escapes.

DataFrames need pandas (``lac-analyst[frames]``), Arrow tables (``as_arrow=True``), Parquet files and exports
of privatized reports need pyarrow (``lac-analyst[arrow]``), plots matplotlib (``lac-analyst[plots]``);
``lac-analyst[notebook]`` takes all three. Each is imported on first use, so ``import lac.analyst`` works
without them.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import logging
import math
import numbers
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from lac.common import retry, tls
from lac.common.errors import ERROR_REASON_KEY, ErrorReason, RemoteError
from lac.common.privacy import ExportedWindows
from lac.common.v1 import curator_pb2, curator_pb2_grpc, reports_pb2

if TYPE_CHECKING:  # pragma: no cover
    import pandas
    import pyarrow

    from lac.common.deployment import Deployment
    from lac.common.privacy import LocalGuarantee

__all__ = [
    "CuratorClient",
    "ReleaseInfo",
    "ReleasePreview",
    "WindowBudget",
    "PerplexityResult",
    "CuratorStatus",
    "AnalystError",
    "FailedPrecondition",
    "BudgetExhausted",
    "ReleaseRefused",
    "NotFound",
    "PermissionDenied",
    "InvalidArgument",
    "ResourceExhausted",
    "Unavailable",
    "ChannelNotReady",
    "PARQUET_RECORD_KEY",
    "Budget",
    "ExportedReports",
    "read_export",
    "error_from_rpc",
    "new_request_id",
    "release_with_retries",
]

EXTRA_FRAMES = "lac-analyst[frames]"  # pandas
EXTRA_ARROW = "lac-analyst[arrow]"  # pyarrow
PARQUET_RECORD_KEY = "lac.release"  # Parquet key-value metadata: the release record as JSON
PARQUET_FORMAT_KEY = "lac.format"
PARQUET_FORMAT = "lac-release/1"
_KNOBS = {
    "S": "s",
    "s": "s",
    "rho": "rho",
    "sensitivity": "sensitivity",
    "calibration": "calibration",
    "public_sensitivity": "public_sensitivity",
    "discovery": "discovery",
    "force": "force",
    "expected_reports": "expected_reports",
}


log = logging.getLogger(__name__)

_UINT32_MAX = 2**32 - 1  # the largest k or order a TopNgramsRequest carries
NOISE_Z = 1.96  # top()'s noise_low/noise_high: probability ∓ NOISE_Z·noise_sd (95% of a normal)
RELEASE_ATTEMPTS = 4  # a release is sent at most this often (same request id) after UNAVAILABLE or a deadline
_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
RELEASE_BACKOFF = retry.Backoff(initial=1.0, maximum=300.0)  # waits up to 1, 2, 4... s; a retry-after up to 300 s
CHANNEL_WAIT = 1800.0  # a release waits at most this long in all for the curator's local channel (sampled once)


def _retryable(exc: BaseException) -> bool:
    """Whether a Release attempt's failure is worth another attempt (UNAVAILABLE, DEADLINE_EXCEEDED)."""
    return isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)) and exc.code() in _RETRYABLE


def new_request_id() -> str:
    """A fresh release request id (random, 32 hex digits)."""
    return uuid.uuid4().hex


def _trailing(exc: grpc.RpcError, name: str) -> str | None:
    """The value of trailing metadata ``name`` of a failed call (None if absent)."""
    try:
        metadata: Any = exc.trailing_metadata() or ()  # (key, value) pairs
        return next((value for key, value in metadata if key == name), None)
    except (AttributeError, TypeError, ValueError):
        return None


def _retry_after(exc: grpc.RpcError) -> float:
    """The server's ``retry-after-seconds`` trailing metadata, 0 if none."""
    try:
        value = _trailing(exc, "retry-after-seconds")
        return 0.0 if value is None else max(0.0, min(float(value), 300.0))
    except (TypeError, ValueError):
        return 0.0


def release_with_retries(
    call: Callable,
    request: curator_pb2.ReleaseRequest,
    timeout: float,
    attempts: int = RELEASE_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
    channel_wait: float = CHANNEL_WAIT,
):
    """``call(request, timeout=timeout)`` (a ``Release`` stub method), sent again with the same request id
    after UNAVAILABLE or DEADLINE_EXCEEDED, waiting the server's ``retry-after-seconds`` at least, else up to
    1, 2, 4... s (``lac.common.retry``: full jitter): the curator returns the release an earlier attempt
    made (spent once), awaits one still running, or makes it. While the curator samples its local channel
    (``ErrorReason.CHANNEL_NOT_READY``) it waits each retry-after it is told, logging a warning with the
    progress first, up to ``channel_wait`` seconds in all (those waits do not count as attempts). Other
    errors, and the last attempt's, are raised (``grpc.RpcError``)."""
    if not request.request_id:
        raise ValueError("release_with_retries needs a request with a request_id (new_request_id())")
    waited, failed = 0.0, 0
    while True:
        try:
            return call(request, timeout=timeout)
        except grpc.RpcError as exc:
            seconds = _retry_after(exc)
            if _error_reason(exc) is ErrorReason.CHANNEL_NOT_READY:
                if waited + seconds > channel_wait:
                    raise
                log.warning("%s; asking again in %.0f s", exc.details(), seconds)
                waited += seconds
                sleep(seconds)
                continue
            failed += 1
            if failed >= attempts or not _retryable(exc):
                raise
            sleep(RELEASE_BACKOFF.delay(failed, seconds))


# -- errors ---------------------------------------------------------------------------------------


class AnalystError(RemoteError):
    """An error reported by the curator (or the transport to it).

    ``status`` is the gRPC status code (``grpc.StatusCode``; None when the transport gave none), ``code`` its
    name (e.g. ``"FAILED_PRECONDITION"``), ``details`` the curator's message, which quotes only public
    quantities (requests, configuration, budgets), and ``reason`` the machine-readable
    ``lac.common.errors.ErrorReason`` the curator sent with it, if any. The subclass is chosen by ``status``
    and ``reason`` only (``error_from_rpc``), never by the message text.
    """

    def __init__(
        self,
        code: str,
        details: str,
        *,
        status: grpc.StatusCode | None = None,
        reason: ErrorReason | None = None,
    ):
        super().__init__(code, details)
        self.status = status if status is not None else getattr(grpc.StatusCode, code, None)
        self.reason = reason


class PermissionDenied(AnalystError):
    """PERMISSION_DENIED or UNAUTHENTICATED: the certificate's identity lacks the role the call needs (or
    identifies no one)."""


class NotFound(AnalystError):
    """NOT_FOUND: an unknown release id."""


class InvalidArgument(AnalystError):
    """INVALID_ARGUMENT: a malformed or out-of-range request (unknown mechanism, bad ε or δ, bad n-gram
    order, unknown windows...)."""


class FailedPrecondition(AnalystError):
    """FAILED_PRECONDITION: the curator is not in a state that allows the request (no reports yet, open
    windows to export, data-dependent releases disabled...). Two kinds have their own subclass:
    ``BudgetExhausted`` and ``ReleaseRefused``."""


class BudgetExhausted(FailedPrecondition):
    """The release would overspend the privacy budget of an accounting window it covers (nothing was
    spent); ``details`` names the windows, what they spent and what remains."""


class ReleaseRefused(FailedPrecondition):
    """The accuracy check predicted that the release's noise would swamp the signal; ``details`` says
    what would help. Retry with ``force=True`` to release anyway (see ``CuratorClient.preview``)."""


class ResourceExhausted(AnalystError):
    """RESOURCE_EXHAUSTED: a limit of the curator is reached (e.g. too many concurrent calls, a message too
    large); retry later or ask for less."""


class Unavailable(AnalystError):
    """UNAVAILABLE or DEADLINE_EXCEEDED: the curator is unreachable (down, wrong address, or the TLS
    handshake was refused) or did not answer in time; retry later."""


class ChannelNotReady(Unavailable):
    """The release needs the curator's local channel, which it is still sampling (once per deployment):
    ``details`` says how far it is and the time left, ``retry_after`` the seconds to wait (nothing was spent).
    ``release`` raises it only after waiting ``CHANNEL_WAIT`` seconds in all."""

    retry_after: float | None = None


_BY_CODE: dict[grpc.StatusCode, type[AnalystError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: PermissionDenied,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: Unavailable,
}
_BY_REASON: dict[ErrorReason, type[AnalystError]] = {
    ErrorReason.BUDGET_EXHAUSTED: BudgetExhausted,
    ErrorReason.RELEASE_REFUSED: ReleaseRefused,
    ErrorReason.CHANNEL_NOT_READY: ChannelNotReady,
}


def _error_reason(exc: grpc.RpcError) -> ErrorReason | None:
    """The ``lac-error-reason`` trailing metadata of a failed call (None if absent or unknown to this client)."""
    value = _trailing(exc, ERROR_REASON_KEY)
    try:
        return None if value is None else ErrorReason(value)
    except ValueError:
        return None


def error_from_rpc(exc: grpc.RpcError) -> AnalystError:
    """The ``AnalystError`` for a failed RPC: its class from the status code and the ``lac-error-reason``
    trailing metadata (``lac.common.errors.ErrorReason``), never from the message."""
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    details = exc.details() if callable(getattr(exc, "details", None)) else None
    details = details or str(exc)
    if not isinstance(code, grpc.StatusCode):
        return AnalystError("UNKNOWN", details)
    reason = _error_reason(exc)
    cls = _BY_CODE.get(code, AnalystError)
    if reason is not None and issubclass(_BY_REASON.get(reason, AnalystError), cls):
        cls = _BY_REASON[reason]
    error = cls(code.name, details, status=code, reason=reason)
    if isinstance(error, ChannelNotReady):
        error.retry_after = _retry_after(exc) or None
    return error


# -- records --------------------------------------------------------------------------------------


def _timestamp(text: str) -> dt.datetime | None:
    try:
        t = dt.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class ReleaseInfo:
    """One release as the caller may see it (the curator's view for the caller's role).

    ``statement`` is rendered by the curator from the release's typed guarantee. ``epsilon`` is
    ``inf`` for a release that is not differentially private (``differentially_private`` False).
    There is deliberately no report count: the curator shows analysts none.
    """

    release_id: str
    created_at: dt.datetime | None
    mechanism: str
    epsilon: float
    delta: float
    differentially_private: bool
    data_dependent: bool
    first_window: int
    last_window: int
    privacy_unit: str
    reports_per_user: int
    statement: str
    sensitivity_method: str
    calibration: str
    gamma: float
    sigma: float
    laplace_scale: float
    ledger_epsilon: float
    ledger_delta: float
    vocab_size: int
    max_n: int
    params: dict[str, float] = field(default_factory=dict)
    request_id: str = ""  # the id of the request that made the release (send it again to get this release)

    @classmethod
    def from_proto(cls, r: curator_pb2.ReleaseRecord) -> ReleaseInfo:
        """From the ``lac.v1.ReleaseRecord`` the curator returned (its ``n_reports`` is not kept)."""
        return cls(
            release_id=r.release_id,
            created_at=_timestamp(r.created_at),
            mechanism=r.mechanism,
            epsilon=r.epsilon,
            delta=r.delta,
            differentially_private=r.differentially_private,
            data_dependent=r.data_dependent,
            first_window=r.first_window,
            last_window=r.last_window,
            privacy_unit=r.privacy_unit,
            reports_per_user=r.reports_per_user,
            statement=r.statement,
            sensitivity_method=r.sensitivity_method,
            calibration=r.calibration,
            gamma=r.gamma,
            sigma=r.sigma,
            laplace_scale=r.laplace_scale,
            ledger_epsilon=r.ledger_epsilon,
            ledger_delta=r.ledger_delta,
            vocab_size=r.vocab_size,
            max_n=r.max_n,
            params={k: float(v) for k, v in sorted(r.params.items())},
            request_id=r.request_id,
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (``created_at`` as RFC 3339; a non-finite ε as None)."""
        d = asdict(self)
        d["created_at"] = self.created_at.isoformat() if self.created_at else None
        d["epsilon"] = _finite_or_none(self.epsilon)
        d["params"] = {k: _finite_or_none(v) for k, v in self.params.items()}
        return d

    def to_json(self) -> str:
        """``to_dict`` as strict JSON."""
        return json.dumps(self.to_dict(), ensure_ascii=False, allow_nan=False)

    def __str__(self) -> str:
        dp = "" if self.differentially_private else "  NOT DIFFERENTIALLY PRIVATE (no budget spent)\n"
        return (
            f"release {self.release_id} ({self.created_at.isoformat() if self.created_at else '?'})\n{dp}"
            f"  mechanism {self.mechanism}, sensitivity {self.sensitivity_method}, calibration "
            f"{self.calibration or '-'}\n"
            f"  (ε, δ) = ({self.epsilon:g}, {self.delta:g}); spent ({self.ledger_epsilon:g}, "
            f"{self.ledger_delta:g}) from each of windows {self.first_window}..{self.last_window}\n"
            f"  {self.vocab_size} n-grams (n ≤ {self.max_n}); privacy unit: {self.privacy_unit}\n"
            f"  {self.statement}"
        )

    def _repr_html_(self) -> str:
        """The record as a small HTML table with its statement (what a notebook shows)."""
        from lac.analyst.notebook import release_html

        return release_html(self)

    def plot_top(
        self,
        k: int = 20,
        *,
        order: int = 0,
        exclude_special: bool = False,
        ax: Any = None,
        client: CuratorClient | None = None,
    ) -> Any:
        """Plot the ``k`` most probable n-grams (``CuratorClient.top``) as bars with their 95% noise intervals
        (matplotlib: ``lac-analyst[plots]``; with pandas or pyarrow); returns the axes. The n-grams are asked
        of ``client``, by default the client this record came from."""
        from lac.analyst.notebook import plot_top

        client = client or self.__dict__.get("_client")
        if client is None:
            raise ValueError("this release record did not come from a CuratorClient: pass client=")
        as_arrow = importlib.util.find_spec("pandas") is None  # a DataFrame, or an Arrow table without pandas
        table = client.top(self, k, order, as_arrow=as_arrow, exclude_special=exclude_special)
        return plot_top(table, self, ax)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_client"}  # the client it came from stays behind


@dataclass(frozen=True)
class WindowBudget:
    """The privacy budget of one accounting window: spent and remaining (ε, δ), and how many exports of its
    privatized reports there were (there the remaining budget bounds central releases only)."""

    window: int
    spent_epsilon: float
    spent_delta: float
    remaining_epsilon: float
    remaining_delta: float
    exports: int = 0


@dataclass(frozen=True)
class Budget:
    """The privacy budget of every accounting window with stored reports or spending
    (``CuratorClient.budget_summary``): the per-window budget, each window's spent and remaining (ε, δ),
    and what it guarantees (``statement``). In a notebook it shows as a table; ``plot()`` draws it."""

    windows: tuple[WindowBudget, ...]
    budget_epsilon: float
    budget_delta: float
    window_seconds: float
    reports_per_window: int

    @property
    def exported(self) -> ExportedWindows | None:
        """The windows whose privatized reports were exported (None: none)."""
        return ExportedWindows.of(w.window for w in self.windows if w.exports)

    @property
    def statement(self) -> str:
        """What the per-window budget guarantees, in words (and what it does not where reports were exported)."""
        text = (
            f"Each accounting window ({self.window_seconds:g} s, at most {self.reports_per_window} report(s) per "
            f"client) has a privacy budget of (ε, δ) = ({self.budget_epsilon:g}, {self.budget_delta:g}): all the "
            "central releases covering a window together are (ε, δ)-differentially private for one client's reports "
            "in it (basic composition), and a release that would overspend a window is refused."
        )
        exported = self.exported
        return text if exported is None else f"{text} {exported.budget_note()}"

    def __str__(self) -> str:
        lines = [
            f"window {w.window}: spent ({w.spent_epsilon:g}, {w.spent_delta:g}), remaining "
            f"({w.remaining_epsilon:g}, {w.remaining_delta:g})"
            + (f", exported {w.exports}x (remaining: central releases only)" if w.exports else "")
            for w in self.windows
        ]
        return "\n".join([*lines, self.statement])

    def _repr_html_(self) -> str:
        """The windows as a small HTML table with the statement (what a notebook shows)."""
        from lac.analyst.notebook import budget_html

        return budget_html(self)

    def plot(self, ax: Any = None) -> Any:
        """Bars of the ε spent and remaining per window, up to the budget (matplotlib: ``lac-analyst[plots]``);
        returns the axes."""
        from lac.analyst.notebook import plot_budget

        return plot_budget(self, ax)


@dataclass(frozen=True)
class ReleasePreview:
    """A release's predicted accuracy (``CuratorClient.preview``); None where it is not known.
    ``budget_after``: each window the release covers, as the ledger would hold it after the release (a
    remaining value below 0: it would be refused); empty for a release that is not charged."""

    mechanism: str
    epsilon: float
    delta: float
    noise: float
    noise_unit: str
    reports: int | None
    reports_source: str
    resolvable: tuple[int, ...]
    signal_share: float | None
    swamped: bool | None
    target_share: float
    reports_needed: int | None
    epsilon_needed: float | None
    advice: str
    statement: str
    budget_after: tuple[WindowBudget, ...] = ()
    channel_progress: float | None = None  # while the curator samples the local channel the release needs: 0..1
    channel_status: str = ""  # ... and where it is, with the time left ("" once it is ready)

    @classmethod
    def from_proto(cls, p: curator_pb2.ReleasePreview) -> ReleasePreview:
        def opt(name):
            return getattr(p, name) if p.HasField(name) else None

        return cls(
            mechanism=p.mechanism,
            epsilon=p.epsilon,
            delta=p.delta,
            noise=p.noise,
            noise_unit=p.noise_unit,
            reports=opt("reports"),
            reports_source=p.reports_source,
            resolvable=tuple(p.resolvable),
            signal_share=opt("signal_share"),
            swamped=opt("swamped"),
            target_share=p.target_share,
            reports_needed=opt("reports_needed"),
            epsilon_needed=opt("epsilon_needed"),
            advice=p.advice,
            statement=p.statement,
            channel_progress=opt("channel_progress"),
            channel_status=p.channel_status,
            budget_after=tuple(
                WindowBudget(w.window, w.spent_epsilon, w.spent_delta, w.remaining_epsilon, w.remaining_delta)
                for w in p.budget_after
            ),
        )

    def __str__(self) -> str:
        return self.statement

    def _repr_html_(self) -> str:
        """The preview as a small HTML table, the budget after it and its statement (what a notebook shows)."""
        from lac.analyst.notebook import preview_html

        return preview_html(self)


@dataclass(frozen=True)
class PerplexityResult:
    """Perplexity of a text under a release's smoothed back-off model (``lac.curator.lm.model``)."""

    perplexity: float
    n_sentences: int
    n_tokens: int  # words plus one </s> per sentence
    n_out_of_vocabulary: int


@dataclass(frozen=True)
class CuratorStatus:
    """The operator's view of the curator (exact counts; operators only)."""

    batches: int
    reports: int
    releases: int
    quarantined: int
    rejects: dict[str, int]
    reports_by_window: dict[int, int]
    budget_epsilon: float
    budget_delta: float
    replay_window_days: float


@dataclass(frozen=True)
class ExportedReports:
    """An export of privatized reports (``CuratorClient.export_reports``): its id, its typed guarantee
    (``lac.common.privacy.LocalGuarantee``: local DP only, no central DP; ``statement`` prints it), the
    number of rows, and the rows as a ``pyarrow.Table`` (column ``words``, list<string>) or the Parquet
    file they were written to. The table's and the file's schema metadata carry the guarantee too."""

    export_id: str
    guarantee: LocalGuarantee
    rows: int
    table: pyarrow.Table | None = None
    path: Path | None = None

    @property
    def statement(self) -> str:
        """The export's guarantee in words (rendered from ``guarantee``)."""
        return self.guarantee.statement()

    def texts(self) -> list[str]:
        """Each row's words joined by spaces (reads the Parquet file if the rows were written to one)."""
        table = self.table
        if table is None:
            assert self.path is not None
            table = _pyarrow().parquet.read_table(self.path)
        return [" ".join(ws) for ws in table.column("words").to_pylist()]


def read_export(stream: Iterable[curator_pb2.ExportChunk], path: str | os.PathLike | None = None) -> ExportedReports:
    """The ``ExportReports`` reply stream as ``ExportedReports``: a table in memory, or with ``path`` written
    chunk by chunk (bounded memory) to a Parquet file, atomically. The stream's errors propagate
    (``CuratorClient.stream`` raises them as ``AnalystError``)."""
    pa = _pyarrow()
    from lac.common import exports as export
    from lac.common.serde import local_guarantee_from_proto

    pq = pa.parquet
    chunks = iter(stream)
    head = next(chunks, None)
    if head is None or not head.HasField("guarantee"):
        raise AnalystError("DATA_LOSS", "the curator's export stream carried no guarantee")
    guarantee = local_guarantee_from_proto(head.guarantee)
    schema = export.SCHEMA.with_metadata(export.parquet_metadata(guarantee, head.export_id))
    rows = 0
    if path is None:
        tables = []
        for c in chunks:
            t = export.read_ipc(c.arrow_ipc)
            rows += t.num_rows
            tables.append(t)
        table = pa.concat_tables([t.cast(export.SCHEMA) for t in tables]) if tables else export.SCHEMA.empty_table()
        table = table.replace_schema_metadata(schema.metadata)
        return ExportedReports(head.export_id, guarantee, rows, table=table)
    from lac.common.files import atomic_file

    out = Path(path)
    with atomic_file(out) as f, pq.ParquetWriter(f, schema, compression="zstd") as writer:
        for c in chunks:
            t = export.read_ipc(c.arrow_ipc)
            rows += t.num_rows
            writer.write_table(t.cast(export.SCHEMA).replace_schema_metadata(schema.metadata))
    return ExportedReports(head.export_id, guarantee, rows, path=out)


# -- optional dependencies ------------------------------------------------------------------------


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


# -- the client -----------------------------------------------------------------------------------


class CuratorClient:
    """A synchronous client of a LAC curator for analysts (and operators).

    ``target`` is ``host:port``. Production curators require mutual TLS: ``ca`` is the CA to trust
    (``ca.pem`` from ``lac keys tls``), ``cert``/``key`` the caller's certificate (common name
    ``analyst`` for the analyst role). ``insecure=True`` uses a plaintext channel, for a local demo
    curator started with ``--insecure`` only. ``timeout`` bounds each query (seconds),
    ``release_timeout`` each release and export.

    Use it as a context manager (or call ``close()``). Methods returning tables give a pandas
    DataFrame, or a ``pyarrow.Table`` with ``as_arrow=True``.
    """

    def __init__(
        self,
        target: str,
        *,
        ca: str | os.PathLike | None = None,
        cert: str | os.PathLike | None = None,
        key: str | os.PathLike | None = None,
        insecure: bool = False,
        timeout: float = 60.0,
        release_timeout: float = 600.0,
    ):
        channel_tls = tls.client_tls(
            str(ca or ""), str(cert or ""), str(key or ""), insecure=insecure, name="CuratorClient"
        )
        self._open(target, channel_tls, timeout, release_timeout)

    @classmethod
    def with_tls(
        cls, target: str, channel_tls: tls.ClientTls | None, *, timeout: float = 60.0, release_timeout: float = 600.0
    ) -> CuratorClient:
        """A client over transport settings already checked (``lac.common.tls.client_tls``; None: plaintext,
        for a curator started with ``--insecure``), as the ``lac curator`` commands hold them."""
        self = cls.__new__(cls)
        self._open(target, channel_tls, timeout, release_timeout)
        return self

    def _open(self, target: str, channel_tls: tls.ClientTls | None, timeout: float, release_timeout: float) -> None:
        self.target = target
        self.timeout = timeout
        self.release_timeout = release_timeout
        self._channel = tls.channel(target, channel_tls)
        self._stub = curator_pb2_grpc.CuratorStub(self._channel)

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> CuratorClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CuratorClient({self.target!r})"

    # -- the RPCs themselves (typed errors), and plumbing

    def call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        """The lower level: one unary RPC of ``lac.v1.Curator`` (``method``, e.g. ``"GetBudget"``, with its
        request message), returning the reply message as the curator sent it; a failure raises the
        ``AnalystError`` of its status code. ``timeout`` defaults to ``self.timeout``. The other methods are
        built on it; ``lac curator`` uses it to print the replies themselves (``--json``)."""
        try:
            return getattr(self._stub, method)(request, timeout=timeout or self.timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    def stream(self, method: str, request: Any, timeout: float | None = None) -> Iterator[Any]:
        """One server-streaming RPC (``"ExportArpa"``, ``"ExportReports"``): its reply messages, a failure at any
        point raised as ``AnalystError``. ``timeout`` (the whole stream) defaults to ``self.release_timeout``."""
        try:
            yield from getattr(self._stub, method)(request, timeout=timeout or self.release_timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    def send_release(
        self, request: curator_pb2.ReleaseRequest, timeout: float | None = None
    ) -> curator_pb2.ReleaseRecord:
        """The lower level of ``release``: send a ``ReleaseRequest`` (given a fresh ``request_id`` if it has
        none) with ``release_with_retries`` and return the curator's ``ReleaseRecord`` message (an operator's
        holds the report count, which ``ReleaseInfo`` does not keep). Failures raise ``AnalystError``."""
        if not request.request_id:
            request.request_id = new_request_id()
        try:
            return release_with_retries(self._stub.Release, request, timeout or self.release_timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    @staticmethod
    def _deps(as_arrow: bool) -> None:
        """Check that what the result needs is installed (before any RPC): pyarrow for an Arrow table,
        pandas for a DataFrame."""
        if as_arrow:
            _pyarrow()
        else:
            _pandas()

    def _ngram_table(self, ngrams, as_arrow: bool, noise: bool = False):
        """The table of released n-grams (``NgramProbability`` messages): ngram, order, probability, and with
        ``noise`` noise_sd, noise_low, noise_high (see ``top``)."""
        grams = [g.ngram for g in ngrams]
        probs = np.array([g.probability for g in ngrams], dtype=np.float64)
        columns = {
            "ngram": (grams, STRING),
            "order": (_orders(grams), INT8),
            "probability": (probs, FLOAT64),
        }
        if noise:
            sd = np.array([g.noise_sd if g.HasField("noise_sd") else math.nan for g in ngrams], dtype=np.float64)
            columns["noise_sd"] = (sd, FLOAT64)
            columns["noise_low"] = (np.maximum(probs - NOISE_Z * sd, 0.0), FLOAT64)
            columns["noise_high"] = (probs + NOISE_Z * sd, FLOAT64)
        return self._table(columns, as_arrow)

    def _table(
        self,
        columns: Mapping[str, tuple[Any, str]],
        as_arrow: bool,
        metadata: Mapping[str, str] | None = None,
        attrs: Mapping[str, Any] | None = None,
    ):
        """A typed Arrow table of ``columns`` (name -> (values, column type: ``STRING``, ``INT8``...)) with the
        schema ``metadata``, or a DataFrame of the same columns and dtypes (built without pyarrow) with
        ``attrs``."""
        self._deps(as_arrow)
        if as_arrow:
            return _arrow_table(columns, metadata)
        return _frame(columns, attrs)

    @staticmethod
    def _id(release: str | ReleaseInfo) -> str:
        return release.release_id if isinstance(release, ReleaseInfo) else str(release)

    # -- releases

    def release(
        self,
        epsilon: float,
        delta: float | None = None,
        mechanism: str | None = None,
        first_window: int | None = None,
        last_window: int | None = None,
        *,
        request_id: str | None = None,
        **knobs: Any,
    ) -> ReleaseInfo:
        """Release the n-gram distribution of the stored reports: spends (ε, δ) from the privacy budget
        of every accounting window the release covers, and returns its record.

        ``mechanism``: ``"posterior"`` (default), ``"bayesian"``, ``"endtoend"``, ``"laplace"`` or
        ``"laplace-public"``; ``delta`` defaults to the curator's release default (1e-6) for the
        mechanisms that need δ > 0 (0 is refused for them); laplace and laplace-public are pure ε-DP
        (δ = 0 whatever is asked).
        ``first_window``/``last_window`` (both or neither; inclusive) select accounting windows; by
        default every window with stored reports. ``knobs``: ``discovery`` (posterior), ``S``
        (BayesianDP decay slope), ``rho``, ``sensitivity`` (``"sound"``; the data-dependent ones are
        NOT differentially private and only run if the operator enabled them), ``calibration``,
        ``public_sensitivity``, ``force`` and ``expected_reports`` (see ``preview``). Raises
        ``BudgetExhausted`` when a window's budget would be overspent (nothing is spent then),
        ``ReleaseRefused`` (a ``FailedPrecondition``) when the accuracy check predicts the noise would swamp
        the signal (unless ``force=True``), ``InvalidArgument`` for a bad request.

        The call is idempotent: it carries ``request_id`` (default: a fresh random one) and is sent
        again with it after UNAVAILABLE or an expired deadline (``RELEASE_ATTEMPTS`` in all), so a
        release is made and charged once however often it is sent; ``Unavailable`` if every attempt
        failed. Pass the same ``request_id`` again later to fetch the release a lost call made.

        On a fresh deployment the curator first samples its local channel (about a minute on 2 cores):
        meanwhile the default release answers at once with UNAVAILABLE, its progress and the time left,
        and this method waits that long (a warning is logged with the progress before each wait) and asks
        again, up to ``CHANNEL_WAIT`` seconds in all, then raises ``ChannelNotReady`` (an ``Unavailable``,
        with ``retry_after``). ``preview`` says how far the sampling is without waiting.
        """
        req = self._release_request(epsilon, delta, mechanism, first_window, last_window, knobs, "release")
        req.request_id = request_id or new_request_id()
        return self._own(ReleaseInfo.from_proto(self.send_release(req)))

    def preview(
        self,
        epsilon: float,
        delta: float | None = None,
        mechanism: str | None = None,
        first_window: int | None = None,
        last_window: int | None = None,
        **knobs: Any,
    ) -> ReleasePreview:
        """What ``release`` with the same arguments would give: its noise and the predicted share of
        the text's words that stand out of it (``lac.curator.runner.preview``). Reads no report, spends
        nothing. ``expected_reports=N`` assumes N reports; without it the prediction uses a DP count
        the curator already holds, if any, and otherwise says how many reports the release needs."""
        req = self._release_request(epsilon, delta, mechanism, first_window, last_window, knobs, "preview")
        return ReleasePreview.from_proto(self.call("PreviewRelease", req))

    def _own(self, record: ReleaseInfo) -> ReleaseInfo:
        """``record``, remembering this client for its ``plot_top`` (not a field: not compared, printed or saved)."""
        object.__setattr__(record, "_client", self)
        return record

    @staticmethod
    def _release_request(epsilon, delta, mechanism, first_window, last_window, knobs, what: str):
        unknown = set(knobs) - set(_KNOBS)
        if unknown:
            raise TypeError(
                f"{what}() got unknown knob(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(_KNOBS))}"
            )
        req = curator_pb2.ReleaseRequest(epsilon=float(epsilon), mechanism=mechanism or "")
        if delta is not None:  # 0 is sent as 0 (pure ε-DP), not as unset
            req.delta = float(delta)
        for name, value in knobs.items():
            if value is not None:
                setattr(req, _KNOBS[name], value)
        if first_window is not None:
            req.first_window = int(first_window)
        if last_window is not None:
            req.last_window = int(last_window)
        return req

    def release_info(self, release_id: str | ReleaseInfo) -> ReleaseInfo:
        """The record of one release (``NotFound`` for an unknown id)."""
        rid = self._id(release_id)
        for r in self.call("ListReleases", curator_pb2.ListReleasesRequest()).releases:
            if r.release_id == rid:
                return self._own(ReleaseInfo.from_proto(r))
        raise NotFound("NOT_FOUND", f"no release {rid!r}")

    def releases(self, as_arrow: bool = False) -> pandas.DataFrame | pyarrow.Table:
        """Every release, one row each: release_id, created_at (UTC), mechanism, epsilon, delta,
        differentially_private, data_dependent, first_window, last_window (the accounting windows
        covered), privacy_unit, reports_per_user, sensitivity_method, calibration, gamma, sigma,
        laplace_scale (0 when the curator does not show them), ledger_epsilon, ledger_delta (spent from
        each covered window), vocab_size, max_n, params (the public knobs and caps) and statement."""
        self._deps(as_arrow)
        recs = [
            ReleaseInfo.from_proto(r) for r in self.call("ListReleases", curator_pb2.ListReleasesRequest()).releases
        ]
        f64, i64, s, b = FLOAT64, INT64, STRING, BOOL

        def col(name):
            return [getattr(r, name) for r in recs]

        return self._table(
            {
                "release_id": (col("release_id"), s),
                "created_at": (col("created_at"), TIMESTAMP),
                "mechanism": (col("mechanism"), s),
                "epsilon": (col("epsilon"), f64),
                "delta": (col("delta"), f64),
                "differentially_private": (col("differentially_private"), b),
                "data_dependent": (col("data_dependent"), b),
                "first_window": (col("first_window"), i64),
                "last_window": (col("last_window"), i64),
                "privacy_unit": (col("privacy_unit"), s),
                "reports_per_user": (col("reports_per_user"), i64),
                "sensitivity_method": (col("sensitivity_method"), s),
                "calibration": (col("calibration"), s),
                "gamma": (col("gamma"), f64),
                "sigma": (col("sigma"), f64),
                "laplace_scale": (col("laplace_scale"), f64),
                "ledger_epsilon": (col("ledger_epsilon"), f64),
                "ledger_delta": (col("ledger_delta"), f64),
                "vocab_size": (col("vocab_size"), i64),
                "max_n": (col("max_n"), i64),
                "params": ([list(p.items()) for p in col("params")], PARAMS),
                "statement": (col("statement"), s),
            },
            as_arrow,
        )

    # -- the released distribution

    def _release_table(self, release_id: str | ReleaseInfo, probability: bool, as_arrow: bool):
        self._deps(as_arrow)
        reply = self.call(
            "GetRelease", curator_pb2.GetReleaseRequest(release_id=self._id(release_id)), self.release_timeout
        )
        record = ReleaseInfo.from_proto(reply.record)
        items = list(reply.items)
        log_probs = np.asarray(reply.log_probs, dtype=np.float64)
        columns = {
            "ngram": (items, STRING),
            "order": (_orders(items), INT8),
            "log_prob": (log_probs, FLOAT64),
        }
        if probability:
            columns["probability"] = (np.exp(log_probs), FLOAT64)
        meta = {PARQUET_RECORD_KEY: record.to_json(), PARQUET_FORMAT_KEY: PARQUET_FORMAT}
        return self._table(columns, as_arrow, meta, {PARQUET_RECORD_KEY: record.to_dict()}), record

    def ngrams(self, release_id: str | ReleaseInfo, as_arrow: bool = False) -> pandas.DataFrame | pyarrow.Table:
        """The whole released distribution, one row per n-gram of the release vocabulary, in the
        release's order: ngram (tokens joined by spaces; ``<s>``/``</s>`` mark sentence boundaries),
        order (its n, int8), log_prob (the released joint log-probability over the whole vocabulary)
        and probability (``exp(log_prob)``). The release record is in ``df.attrs["lac.release"]``
        (an Arrow table's schema metadata, as JSON)."""
        return self._release_table(release_id, True, as_arrow)[0]

    def top(
        self,
        release_id: str | ReleaseInfo,
        k: int = 20,
        order: int = 0,
        as_arrow: bool = False,
        *,
        exclude_special: bool = False,
    ) -> pandas.DataFrame | pyarrow.Table:
        """The ``k`` most probable n-grams of a release, most probable first: ngram, order, probability,
        noise_sd, noise_low, noise_high.

        ``k`` is an integer >= 1 (``ValueError`` otherwise, before any call: 0 is not read as a
        default); fewer rows come back when the release has fewer n-grams to list. ``order`` = n
        restricts to n-grams of that n, with probabilities renormalised within the order (the joint
        distribution of n-grams); 0 = any order, joint over the whole vocabulary.
        ``exclude_special=True`` leaves out every n-gram with a special token (``<unk>``, a word
        outside the vocabulary; ``<s>``/``</s>``, sentence boundaries); the others keep their
        probabilities (not renormalised), the same as ``probability()`` gives.

        ``noise_sd`` is the standard deviation of the Gaussian noise the DP mechanism added to the n-gram's
        count, on the scale of ``probability`` (the record's public σ over the release's pseudo-count scale:
        no other data enter), and [``noise_low``, ``noise_high``] = probability ∓ 1.96·noise_sd (the low end
        at least 0): how far the noise alone would move it 95% of the time. It is not the whole error: the
        posterior's shrinkage towards the public prior and the noise of the normalising total are not in it.
        NaN where the release states no such number: mechanisms other than the posterior, a channel-aware
        clean estimate (deconvolution amplifies the noise by an amount the release does not state), and an
        order whose pseudo-counts were scaled up to the public prior's strength (weak data).
        """
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"k must be an integer >= 1 (how many n-grams to list), got {k!r}")
        if isinstance(order, bool) or not isinstance(order, numbers.Integral) or order < 0:
            raise ValueError(f"order must be 0 (any) or an n >= 1, got {order!r}")
        self._deps(as_arrow)  # a missing dependency fails before the RPC
        request = curator_pb2.TopNgramsRequest(
            release_id=self._id(release_id),
            k=min(int(k), _UINT32_MAX),  # more than the wire holds: as many as there are
            order=min(int(order), _UINT32_MAX),  # (refused by the curator as no such order)
            exclude_special=bool(exclude_special),
        )
        return self._ngram_table(self.call("TopNgrams", request).ngrams, as_arrow, noise=True)

    def probability(
        self, release_id: str | ReleaseInfo, ngrams: str | Iterable[str], as_arrow: bool = False
    ) -> pandas.DataFrame | pyarrow.Table:
        """The released probability of each n-gram (a string ``"the dog"`` or several): ngram
        (normalised spacing), order, probability (joint within its order; 0 outside the vocabulary)."""
        self._deps(as_arrow)  # a missing dependency fails before the RPC
        asked = [ngrams] if isinstance(ngrams, str) else list(ngrams)
        reply = self.call(
            "NgramProbabilities", curator_pb2.NgramProbabilitiesRequest(release_id=self._id(release_id), ngrams=asked)
        )
        return self._ngram_table(reply.ngrams, as_arrow)

    def next_word(
        self, release_id: str | ReleaseInfo, context: str, k: int = 10, as_arrow: bool = False
    ) -> pandas.DataFrame | pyarrow.Table:
        """The ``k`` most probable next words after ``context`` (preceding words separated by spaces;
        ``"<s>"`` = sentence start), most probable first: context_used (the suffix of the context the
        release conditions on, shorter when it backs off; empty = unigrams), word, probability
        (P(word | context_used) from the released joint)."""
        self._deps(as_arrow)
        reply = self.call(
            "NextWord", curator_pb2.NextWordRequest(release_id=self._id(release_id), context=context, k=int(k))
        )
        n = len(reply.words)
        return self._table(
            {
                "context_used": ([reply.context_used] * n, STRING),
                "word": ([w.ngram for w in reply.words], STRING),
                "probability": ([w.probability for w in reply.words], FLOAT64),
            },
            as_arrow,
        )

    def perplexity(self, release_id: str | ReleaseInfo, text: str) -> PerplexityResult:
        """Perplexity of ``text`` (split into sentences and words by the LAC tokeniser) under the
        release's smoothed back-off trigram model, with the token and out-of-vocabulary counts."""
        r = self.call(
            "Perplexity",
            curator_pb2.PerplexityRequest(release_id=self._id(release_id), text=text),
            self.release_timeout,
        )
        return PerplexityResult(r.perplexity, r.n_sentences, r.n_tokens, r.n_out_of_vocabulary)

    # -- budget and configuration

    def budget(self, as_arrow: bool = False) -> pandas.DataFrame | pyarrow.Table:
        """The privacy budget per accounting window (windows with stored reports or spending), one row
        each: window, window_start, window_end (UTC), spent_epsilon, spent_delta, remaining_epsilon,
        remaining_delta, budget_epsilon, budget_delta (the per-window budget; basic composition), exports (how
        many exports of privatized reports covered the window: listed, never charged; see ``exports``; where it is
        not 0 the remaining budget bounds central releases only: ``budget_summary().statement`` says how they
        compose)."""
        self._deps(as_arrow)
        b = self.call("GetBudget", curator_pb2.BudgetRequest())
        ws = b.window_seconds
        utc = dt.UTC

        def at(seconds: float) -> dt.datetime:
            return dt.datetime.fromtimestamp(seconds, utc)

        f64, n = FLOAT64, len(b.windows)
        ts = TIMESTAMP
        return self._table(
            {
                "window": ([w.window for w in b.windows], INT64),
                "window_start": ([at(w.window * ws) for w in b.windows], ts),
                "window_end": ([at((w.window + 1) * ws) for w in b.windows], ts),
                "spent_epsilon": ([w.spent_epsilon for w in b.windows], f64),
                "spent_delta": ([w.spent_delta for w in b.windows], f64),
                "remaining_epsilon": ([w.remaining_epsilon for w in b.windows], f64),
                "remaining_delta": ([w.remaining_delta for w in b.windows], f64),
                "budget_epsilon": ([b.budget_epsilon] * n, f64),
                "budget_delta": ([b.budget_delta] * n, f64),
                "exports": ([w.exports for w in b.windows], INT64),
            },
            as_arrow,
            attrs={"window_seconds": ws, "reports_per_window": b.reports_per_window},
        )

    def budget_summary(self) -> Budget:
        """The privacy budget per accounting window as a ``Budget`` (a table and its statement in a notebook,
        ``.plot()`` for a chart); ``budget`` gives the same windows as a DataFrame."""
        b = self.call("GetBudget", curator_pb2.BudgetRequest())
        return Budget(
            windows=tuple(
                WindowBudget(
                    w.window, w.spent_epsilon, w.spent_delta, w.remaining_epsilon, w.remaining_delta, w.exports
                )
                for w in b.windows
            ),
            budget_epsilon=b.budget_epsilon,
            budget_delta=b.budget_delta,
            window_seconds=b.window_seconds,
            reports_per_window=b.reports_per_window,
        )

    def exports(self, as_arrow: bool = False) -> pandas.DataFrame | pyarrow.Table:
        """Every export of privatized reports the curator's ledger lists (never charged), oldest first:
        export_id, identity (the exporter's certificate common name), exported_at (UTC), first_window,
        last_window, rows (an exact count: shown to operators and to the identity that exported, else null)."""
        self._deps(as_arrow)
        e = self.call("GetBudget", curator_pb2.BudgetRequest()).exports
        return self._table(
            {
                "export_id": ([x.export_id for x in e], STRING),
                "identity": ([x.identity for x in e], STRING),
                "exported_at": ([_timestamp(x.exported_at) for x in e], TIMESTAMP),
                "first_window": ([x.first_window for x in e], INT64),
                "last_window": ([x.last_window for x in e], INT64),
                "rows": ([x.rows if x.HasField("rows") else None for x in e], NULLABLE_INT64),
            },
            as_arrow,
        )

    def deployment(self) -> Deployment:
        """The local-privacy configuration the curator publishes to clients (``lac.common.deployment.
        Deployment``: mechanism, ε per word, embedding, L words per report, k reports per client per
        window of ``window_seconds``; ``report_epsilon0`` and ``report_guarantee().statement()``)."""
        from lac.common.errors import LacError
        from lac.common.serde import deployment_from_proto

        m = self.call("GetDeployment", reports_pb2.DeploymentRequest())
        try:
            return deployment_from_proto(m)
        except LacError as exc:
            raise AnalystError("UNKNOWN", f"the curator published an invalid deployment: {exc}") from None

    def server_version(self) -> str:
        """The curator's name and version as it publishes them with its deployment, e.g.
        ``"lac-curator 0.1.0"`` (empty from curators older than this field)."""
        return str(self.call("GetDeployment", reports_pb2.DeploymentRequest()).server_version)

    def status(self) -> CuratorStatus:
        """Operators only (an analyst's certificate gets ``PermissionDenied``): stored batches and
        reports (exact), releases, quarantined reports, rejects by reason, reports per window."""
        s = self.call("GetStatus", curator_pb2.CuratorStatusRequest())
        return CuratorStatus(
            batches=s.batches,
            reports=s.reports,
            releases=s.releases,
            quarantined=s.quarantined,
            rejects=dict(sorted(s.rejects.items())),
            reports_by_window=dict(sorted(s.reports_by_window.items())),
            budget_epsilon=s.budget_epsilon,
            budget_delta=s.budget_delta,
            replay_window_days=s.replay_window_days,
        )

    # -- exports

    def _write(self, path: str | os.PathLike, write: Callable) -> Path:
        from lac.common.files import atomic_file

        path = Path(path)
        with atomic_file(path) as f:
            write(f)
        return path

    def arpa(self, release_id: str | ReleaseInfo, path: str | os.PathLike) -> Path:
        """Write the release as an ARPA back-off language model (for KenLM, SRILM) to ``path``
        (atomically: a reader sees the old file or the complete new one); returns the path."""
        chunks = self.stream("ExportArpa", curator_pb2.ExportArpaRequest(release_id=self._id(release_id)))

        def write(f):
            for c in chunks:
                f.write(c.text.encode("utf-8"))

        return self._write(path, write)

    def export_reports(
        self, windows: int | tuple[int, int] | range, path: str | os.PathLike | None = None
    ) -> ExportedReports:
        """The privatized reports of closed accounting ``windows`` (one window, an inclusive (first, last) pair,
        or a range), if the curator's operator granted this identity export (``export_identities``; off by
        default): one row per report, its words only, in a fresh uniformly random order. Returns
        ``ExportedReports`` with the rows as a ``pyarrow.Table``, or, with ``path``, written to that Parquet file
        (streamed, bounded memory). Its ``guarantee``/``statement`` says what the rows are: local DP only (per-word
        metric DP, at most L words per report, k reports per client per window, shuffled), no central DP; the
        curator records the export with its ledger and charges nothing. Open windows: ``AnalystError``
        (FAILED_PRECONDITION); unknown ones: ``InvalidArgument``; no grant: ``PermissionDenied``."""
        if isinstance(windows, range):
            if not len(windows) or windows.step != 1:
                raise ValueError("windows: a non-empty range of consecutive windows")
            first, last = windows[0], windows[-1]
        elif isinstance(windows, tuple):
            first, last = windows
        else:
            first = last = int(windows)
        _pyarrow()
        request = curator_pb2.ExportReportsRequest(first_window=int(first), last_window=int(last))
        return read_export(self.stream("ExportReports", request), path)

    def export_parquet(self, release_id: str | ReleaseInfo, path: str | os.PathLike) -> Path:
        """Write the released distribution to a Parquet file (atomically) readable by pyarrow, pandas,
        DuckDB or Spark: columns ngram (string), order (int8), log_prob (float64), one row per n-gram
        of the release vocabulary. The key-value metadata holds the release record as JSON under
        ``"lac.release"`` (pandas ``read_parquet`` also restores it as ``df.attrs["lac.release"]``).
        Returns the path."""
        pq = _pyarrow().parquet
        table, record = self._release_table(release_id, False, True)
        meta = dict(table.schema.metadata or {})
        meta[b"PANDAS_ATTRS"] = json.dumps({PARQUET_RECORD_KEY: record.to_dict()}, allow_nan=False).encode()
        table = table.replace_schema_metadata(meta)
        return self._write(path, lambda f: pq.write_table(table, f))
