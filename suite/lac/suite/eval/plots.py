"""Matplotlib helpers (Agg backend: files only, no display)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter


def _minor_label(v: float, _pos) -> str:
    if v <= 0:
        return ""
    mantissa = v / 10.0 ** np.floor(np.log10(v))
    return f"{v:g}" if np.isclose(mantissa, 2.0) or np.isclose(mantissa, 5.0) else ""


def new(ncols: int = 1, title: str = ""):
    """A figure with ``ncols`` axes side by side (and a title); returns (figure, axes)."""
    fig, axes = plt.subplots(1, ncols, figsize=(5.2 * ncols, 4.0), squeeze=False)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig, list(axes[0])


def band(ax, x, runs: list[list[float]], label: str, marker: str = "o", **kw) -> None:
    """Median over runs with a min–max band."""
    a = np.array([np.asarray(r, dtype=float) for r in runs])
    ax.plot(x, np.median(a, axis=1), marker=marker, ms=4, label=label, **kw)
    if a.shape[1] > 1:
        ax.fill_between(x, a.min(axis=1), a.max(axis=1), alpha=0.2)


def hline(ax, y: float, label: str, **kw) -> None:
    """A dashed horizontal reference line at ``y``."""
    ax.axhline(y, ls="--", lw=1, label=label, **kw)


def finish(fig, axes, path: Path, *, xlabel=None, ylabel=None, logx=False, logy=False) -> Path:
    """Scales, labels, grid and legend on ``axes``; save the figure to ``path`` and close it."""
    for ax in axes:
        if logx:
            ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
            if scale == "log":  # plain numbers; minor ticks labelled at 2 and 5 only
                axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                lo, hi = sorted(axis.get_view_interval())
                narrow = lo > 0 and hi / lo < 4  # less than a decade: label every minor tick
                axis.set_minor_formatter(FuncFormatter((lambda v, _: f"{v:.3g}") if narrow else _minor_label))
        if xlabel:
            ax.set_xlabel(xlabel)
        if ylabel:
            ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
