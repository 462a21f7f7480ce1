"""Notebook output for analysts: small HTML tables (``_repr_html_`` of releases, previews and budgets,
each with its guarantee statement) and matplotlib plots (top n-grams with their error bars, the
budget per accounting window).

Every value that reaches HTML is escaped (``html.escape``), so a statement, an n-gram or an advice string
can never add markup. matplotlib is imported only when a plot is drawn; it comes with the extra
``lac-analyst[plots]`` (or ``lac-analyst[notebook]``).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes

    from lac.analyst.client import Budget, ReleaseInfo, ReleasePreview, WindowBudget

__all__ = ["html_table", "release_html", "preview_html", "budget_html", "plot_top", "plot_budget"]

EXTRA = "lac-analyst[plots]"
_STYLE = "border-collapse:collapse;text-align:left"


def _cell(value: Any) -> str:
    """One value as escaped HTML text (floats in ``g`` format; None as an em dash)."""
    if value is None:
        return "—"
    if isinstance(value, float):
        return html.escape(f"{value:.6g}")
    return html.escape(str(value))


def html_table(rows: Iterable[Sequence[Any]], header: Sequence[str] | None = None, caption: str = "") -> str:
    """An HTML table of ``rows`` (a row per sequence), with an optional ``header`` row and ``caption``;
    every value escaped."""
    parts = [f'<table style="{_STYLE}">']
    if caption:
        parts.append(f"<caption>{_cell(caption)}</caption>")
    if header:
        parts.append("<thead><tr>" + "".join(f"<th>{_cell(h)}</th>" for h in header) + "</tr></thead>")
    parts.append("<tbody>")
    parts.extend("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    parts.append("</tbody></table>")
    return "".join(parts)


def _fields(rows: Iterable[tuple[str, Any]], caption: str) -> str:
    """A two-column table: field name (as a row header), value."""
    body = "".join(f"<tr><th>{_cell(k)}</th><td>{_cell(v)}</td></tr>" for k, v in rows)
    return f'<table style="{_STYLE}"><caption>{_cell(caption)}</caption><tbody>{body}</tbody></table>'


def _statement(text: str) -> str:
    return f'<p class="lac-statement">{_cell(text)}</p>'


def _window_rows(windows: Iterable[WindowBudget]) -> list[tuple[Any, ...]]:
    return [
        (w.window, w.spent_epsilon, w.spent_delta, w.remaining_epsilon, w.remaining_delta, w.exports) for w in windows
    ]


_WINDOW_HEADER = ("window", "spent ε", "spent δ", "remaining ε", "remaining δ", "exports")


def release_html(r: ReleaseInfo) -> str:
    """A release record as an HTML table, its statement below (and a warning first when not DP)."""
    warning = (
        ""
        if r.differentially_private
        else "<p><strong>NOT DIFFERENTIALLY PRIVATE</strong> (data-dependent; no budget spent)</p>"
    )
    rows = [
        ("mechanism", r.mechanism),
        ("(ε, δ)", f"({r.epsilon:g}, {r.delta:g})"),
        ("spent per window", f"({r.ledger_epsilon:g}, {r.ledger_delta:g})"),
        ("windows", f"{r.first_window}..{r.last_window}"),
        ("privacy unit", r.privacy_unit),
        ("sensitivity", r.sensitivity_method),
        ("calibration", r.calibration or "—"),
        ("noise σ", r.sigma),
        ("n-grams", f"{r.vocab_size:,} (n ≤ {r.max_n})"),
        ("created", r.created_at.isoformat() if r.created_at else None),
    ]
    return (
        f'<div class="lac-release">{warning}{_fields(rows, f"release {r.release_id}")}{_statement(r.statement)}</div>'
    )


def preview_html(p: ReleasePreview) -> str:
    """A release preview as an HTML table (accuracy, advice), the budget after it, its statement below."""
    rows = [
        ("mechanism", p.mechanism),
        ("(ε, δ)", f"({p.epsilon:g}, {p.delta:g})"),
        ("noise", f"{p.noise:.6g} {p.noise_unit}"),
        ("reports", f"{p.reports:,} ({p.reports_source})" if p.reports is not None else None),
        ("signal share", p.signal_share),
        ("swamped by noise", p.swamped),
        ("reports needed", p.reports_needed),
        ("ε needed", p.epsilon_needed),
        ("advice", p.advice),
    ]
    after = (
        html_table(_window_rows(p.budget_after), _WINDOW_HEADER, "budget of each window after this release")
        if p.budget_after
        else ""
    )
    return f'<div class="lac-preview">{_fields(rows, "release preview")}{after}{_statement(p.statement)}</div>'


def budget_html(b: Budget) -> str:
    """The budget per accounting window as an HTML table, its statement below."""
    caption = f"privacy budget per window: (ε, δ) = ({b.budget_epsilon:g}, {b.budget_delta:g})"
    table = html_table(_window_rows(b.windows), _WINDOW_HEADER, caption)
    return f'<div class="lac-budget">{table}{_statement(b.statement)}</div>'


def _pyplot() -> Any:
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError(f"plots need matplotlib: pip install '{EXTRA}'") from exc
    return plt


def _axes(ax: Axes | None, size: tuple[float, float]) -> Axes:
    if ax is not None:
        return ax
    _, ax = _pyplot().subplots(figsize=size)
    return ax


def plot_top(table: Any, release: ReleaseInfo | None = None, ax: Axes | None = None) -> Axes:
    """Horizontal bars of a ``CuratorClient.top`` table (a pandas DataFrame or a pyarrow Table), most
    probable at the top, each with its error bar (the interval ``noise_low``..``noise_high`` at the table's
    level, ``lac.error_bars`` in its metadata) where the release has one; the axes (new ones unless ``ax`` is
    given). An interval is drawn as it is, also where it does not contain the released probability (Laplace)."""
    columns = table.to_pydict() if hasattr(table, "to_pydict") else {c: list(table[c]) for c in table.columns}
    ngrams = [str(g) for g in columns["ngram"]]
    p = [float(x) for x in columns["probability"]]
    low = [float(x) for x in columns.get("noise_low", [math.nan] * len(p))]
    high = [float(x) for x in columns.get("noise_high", [math.nan] * len(p))]
    ax = _axes(ax, (7.0, 0.3 * len(ngrams) + 1.5))
    y = list(range(len(ngrams)))
    ax.barh(y, p, color="#4c72b0")
    stated = [i for i in y if math.isfinite(low[i]) and math.isfinite(high[i])]
    if stated:
        level = _error_bar_level(table)
        ax.hlines(stated, [low[i] for i in stated], [high[i] for i in stated], color="black", linewidth=1.2)
        for ends in (low, high):
            ax.plot([ends[i] for i in stated], stated, linestyle="none", marker="|", markersize=8, color="black")
        ax.plot([], [], color="black", marker="|", label=f"{level:.0%} interval due to the DP noise" if level else "")
        ax.legend(loc="lower right")
    ax.set_yticks(y, ngrams)
    ax.invert_yaxis()  # the most probable first, at the top
    ax.set_xlabel("released probability")
    title = f"top {len(ngrams)} n-grams"
    if release is not None:
        r = release
        title += f" of release {r.release_id[:8]} ({r.mechanism}, ε = {r.epsilon:g}, δ = {r.delta:g})"
    if not stated and ngrams:
        title += "\n(no error bars for these n-grams: see the release's statement)"
    ax.set_title(title)
    return ax


def _error_bar_level(table: Any) -> float | None:
    """The level of a ``top`` table's intervals, from its metadata (None: not recorded)."""
    from lac.analyst.client import ERROR_BARS_KEY

    if hasattr(table, "schema"):  # an Arrow table
        raw = (table.schema.metadata or {}).get(ERROR_BARS_KEY.encode())
        described = json.loads(raw) if raw else {}
    else:
        described = getattr(table, "attrs", {}).get(ERROR_BARS_KEY, {})
    level = described.get("level")
    return float(level) if level else None


def plot_budget(budget: Budget, ax: Axes | None = None) -> Axes:
    """Bars of the ε spent and remaining in each accounting window (stacked up to the per-window budget, a
    dashed line); the axes (new ones unless ``ax`` is given)."""
    windows = [str(w.window) for w in budget.windows]
    spent = [w.spent_epsilon for w in budget.windows]
    left = [max(w.remaining_epsilon, 0.0) for w in budget.windows]
    ax = _axes(ax, (max(4.0, 0.6 * len(windows) + 2.0), 4.0))
    x = list(range(len(windows)))
    ax.bar(x, spent, color="#c44e52", label="ε spent")
    ax.bar(x, left, bottom=spent, color="#55a868", label="ε remaining")
    ax.axhline(budget.budget_epsilon, color="black", linestyle="--", linewidth=1, label="budget per window")
    ax.set_xticks(x, windows)
    ax.set_xlabel("accounting window")
    ax.set_ylabel("ε")
    ax.set_title(f"privacy budget per window: (ε, δ) = ({budget.budget_epsilon:g}, {budget.budget_delta:g})")
    ax.legend(loc="upper right")
    return ax
