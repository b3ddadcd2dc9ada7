"""Attention heatmaps: target pieces down the side, source pieces along the top.

Only matplotlib's object API is used, on figures created directly from
:class:`matplotlib.figure.Figure` with an Agg canvas: no pyplot state machine, no GUI backend,
no global ``rcParams`` changes. Safe in worker threads, headless servers and TensorBoard's
``add_figure``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from seq2seq.atomic import atomic_write

# Inches per source/target piece, and limits so that long sentences stay readable.
_CELL_INCHES = 0.32
_MIN_INCHES, _MAX_INCHES = 3.0, 30.0


def plot_attention(
    weights,
    source_pieces: Sequence[str],
    target_pieces: Sequence[str],
    *,
    title: str | None = None,
) -> Figure:
    """An attention matrix as a heatmap, on a Figure with an Agg canvas that the caller saves
    or logs.

    Shape:
        - weights: (T, S), an array or a tensor, one row per target step;
          ``T == len(target_pieces)`` and ``S == len(source_pieces)`` (the row and column
          labels, e.g. the output and the source pieces, each plus ``"</s>"``)
    """
    if hasattr(weights, "detach"):  # a torch tensor
        weights = weights.detach().float().cpu().numpy()
    weights = np.asarray(weights, dtype=np.float32)
    if weights.ndim != 2:
        raise ValueError(f"attention weights must be 2-D (T, S), got shape {weights.shape}")
    if weights.shape != (len(target_pieces), len(source_pieces)):
        raise ValueError(
            f"attention weights of shape {weights.shape} do not match {len(target_pieces)} "
            f"target and {len(source_pieces)} source pieces"
        )
    rows, columns = weights.shape
    width = min(max(_CELL_INCHES * columns + 1.5, _MIN_INCHES), _MAX_INCHES)
    height = min(max(_CELL_INCHES * rows + 1.2, _MIN_INCHES), _MAX_INCHES)
    figure = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(figure)  # attaches itself to the figure: savefig works without pyplot
    axes = figure.add_subplot()
    image = axes.imshow(weights, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    axes.set_xticks(np.arange(columns), labels=list(source_pieces), rotation=90, fontsize=8)
    axes.set_yticks(np.arange(rows), labels=list(target_pieces), fontsize=8)
    axes.xaxis.tick_top()  # source reads left to right above the matrix
    axes.set_xlabel("source")
    axes.set_ylabel("target")
    if title:
        axes.set_title(title, fontsize=10, pad=12)
    figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04)
    figure.tight_layout()
    return figure


def save_attention_plot(
    path: str | os.PathLike,
    weights,
    source_pieces: Sequence[str],
    target_pieces: Sequence[str],
    *,
    title: str | None = None,
) -> Path:
    """:func:`plot_attention`'s heatmap written to ``path`` (in the format its suffix names,
    PNG without one; its folder created when missing); returns the path."""
    path = Path(path)
    figure = plot_attention(weights, source_pieces, target_pieces, title=title)
    with atomic_write(path) as handle:
        figure.savefig(handle, format=path.suffix.lstrip(".") or "png")
    return path
