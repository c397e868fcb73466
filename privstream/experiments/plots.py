"""Plots of releases against the truth (needs the ``plot`` extra; matplotlib is imported
lazily, and only its object API is used: no pyplot global state)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray


def plot_releases(
    truth: ArrayLike,
    estimates: Mapping[str, ArrayLike],
    path: str | Path,
    title: str,
    ylabel: str = "frequency of 1",
) -> Path:
    """Save a PNG comparing the true value-1 frequency (``truth``, length T) with each
    mechanism's released value-1 frequency (or any other released scalar, with ``ylabel``).

    One small-multiple panel per mechanism, titled with its MAE; shared axes whose y range is
    robust to rare outlying releases (they are clipped at the panel edge); truth in black,
    releases in colour. Renders on the Agg canvas without touching pyplot's global state.
    Needs the ``plot`` extra (matplotlib). Returns the path written.
    """
    from matplotlib.lines import Line2D

    c = np.asarray(truth, dtype=np.float64)
    series = {name: np.asarray(r, dtype=np.float64) for name, r in estimates.items()}
    if c.ndim != 1 or any(r.shape != c.shape for r in series.values()):
        raise ValueError("truth and every release series must be one-dimensional of equal length")
    if not series:
        raise ValueError("plot_releases needs at least one mechanism")
    fig = _panels(c, series, ylabel)
    handles = [
        Line2D([], [], color="black", linewidth=1.4, label="true"),
        Line2D([], [], color="grey", linewidth=0.9, label="released (colour per mechanism)"),
    ]
    fig.legend(handles=handles, loc="upper right", ncols=2, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=11, x=0.01, horizontalalignment="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out


def _y_range(
    c: NDArray[np.float64], series: Mapping[str, NDArray[np.float64]]
) -> tuple[float, float]:
    """Shared y limits robust to rare outlying releases (they are clipped at the edge)."""
    stacked = np.concatenate([c, *series.values()])
    stacked = stacked[np.isfinite(stacked)]
    lo = min(float(c.min()), float(np.percentile(stacked, 0.5)))
    hi = max(float(c.max()), float(np.percentile(stacked, 99.5)))
    pad = 0.05 * (hi - lo or 1.0)
    return lo - pad, hi + pad


def _panels(c: NDArray[np.float64], series: Mapping[str, NDArray[np.float64]], ylabel: str) -> Any:
    """One panel per mechanism (two columns), truth in black, releases in colour."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure registry

    slots = np.arange(1, c.shape[0] + 1)
    ylim = _y_range(c, series)
    count = len(series)
    ncols = 1 if count == 1 else 2
    nrows = math.ceil(count / ncols)
    fig = Figure(figsize=(6.5 * ncols, 2.3 * nrows + 0.8))
    axes = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False)
    colours = colormaps["tab10"]
    for i, (name, r) in enumerate(series.items()):
        ax = axes[i // ncols][i % ncols]
        ax.plot(slots, r, color=colours(i % 10), linewidth=0.9)
        ax.plot(slots, c, color="black", linewidth=1.4)
        ax.set_title(f"{name}   (MAE {np.mean(np.abs(r - c)):.4f})", fontsize=10, loc="left")
        ax.set_ylim(*ylim)
        ax.grid(True, alpha=0.3)
    for j in range(count, nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("slot t")
    for row in axes:
        row[0].set_ylabel(ylabel)
    if count % ncols:  # the last visible panel of a short last row needs its own x labels
        axes[-2][-1].xaxis.set_tick_params(labelbottom=True)
        axes[-2][-1].set_xlabel("slot t")
    return fig
