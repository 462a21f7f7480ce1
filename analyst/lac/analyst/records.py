"""What the analyst client returns: release records, budgets, previews, status and exports, as frozen dataclasses
read from the curator's replies."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import math
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lac.analyst.errors import AnalystError
from lac.analyst.frames import _pyarrow
from lac.common.privacy import ERROR_BAR_LEVEL, ExportedWindows
from lac.common.v1 import curator_pb2

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow

    from lac.analyst.client import CuratorClient
    from lac.common.privacy import LocalGuarantee


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

    ``statement`` is rendered by the curator from the release's typed guarantee (and ends with what its
    error bars describe: ``error_bars``, empty for a release made before releases had them). ``epsilon`` is
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
    error_bars: str = ""  # what its per-n-gram error bars describe (or why it has none)

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
            error_bars=r.error_bars,
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
        level: float = ERROR_BAR_LEVEL,
        ax: Any = None,
        client: CuratorClient | None = None,
    ) -> Any:
        """Plot the ``k`` most probable n-grams (``CuratorClient.top``) as bars with their error bars at ``level``
        (matplotlib: ``lac-analyst[plots]``; with pandas or pyarrow); returns the axes. The n-grams are asked
        of ``client``, by default the client this record came from."""
        from lac.analyst.notebook import plot_top

        client = client or self.__dict__.get("_client")
        if client is None:
            raise ValueError("this release record did not come from a CuratorClient: pass client=")
        as_arrow = importlib.util.find_spec("pandas") is None  # a DataFrame, or an Arrow table without pandas
        table = client.top(self, k, order, as_arrow=as_arrow, exclude_special=exclude_special, level=level)
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
