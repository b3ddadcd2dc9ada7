"""The comparison's figures, drawn with matplotlib's object API on Agg canvases.

Which figures, and what each shows: docs/compare.md, "What `compare.py` does" (its "Outputs"). A
group's validation curve is the mean of its runs' curves, each interpolated linearly on a common
grid and held at its last value after its end.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from seq2seq.atomic import atomic_write


def _save(figure: Figure, path: Path) -> Path:
    """Write ``figure`` in the format its extension names (png, svg, pdf...).

    Raises:
        ValueError: for an extension matplotlib cannot write.
    """
    path = Path(path)
    with atomic_write(path) as handle:
        figure.savefig(handle, format=path.suffix.lstrip(".").lower() or "png", dpi=100,
                       bbox_inches="tight")
    return path


def _figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    return figure


def _legend_below(axes: Any, fontsize: int) -> None:
    """The legend under the axes, one group a line: group labels are long (a label names every
    setting the groups differ in), and inside the axes they would cover the lines."""
    axes.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(0.0, -0.16),
                borderaxespad=0.0, frameon=False)


def plot_bleu_curves(
    path: Path, curves: Mapping[str, Sequence[Sequence[tuple[float, float]]]], points: int = 200,
    *, x_label: str = "training minutes"
) -> Path:
    """``curves``: per group label, per run, ``(x, BLEU)`` pairs (x: minutes, or steps). A
    group of one run is its validations, marked; a larger one their mean and min-max band."""
    figure = _figure(7, 4.5)
    axes = figure.add_subplot()
    for label, runs in curves.items():
        runs = [sorted(run) for run in runs if run]
        if len(runs) == 1:
            axes.plot(*zip(*runs[0], strict=True), marker="o", markersize=3, label=label)
            continue
        if not runs:
            continue
        end = max(run[-1][0] for run in runs)
        grid = np.linspace(0.0, end if end > 0 else 1.0, points)
        values = np.array([np.interp(grid, [m for m, _ in run], [b for _, b in run])
                           for run in runs])
        (line,) = axes.plot(grid, values.mean(axis=0), label=f"{label} ({len(runs)} runs)")
        axes.fill_between(grid, values.min(axis=0), values.max(axis=0), alpha=0.2,
                          color=line.get_color(), linewidth=0)
    axes.set_xlabel(x_label)
    axes.set_ylabel("validation BLEU")
    axes.grid(alpha=0.3)
    if axes.lines:
        _legend_below(axes, 8)
    else:
        axes.text(0.5, 0.5, "no valid/bleu in the runs' TensorBoard logs", ha="center",
                  transform=axes.transAxes)
    return _save(figure, path)


def plot_group_bleu(
    path: Path, groups: Sequence[tuple[str, float, float, Sequence[float]]], *, split: str
) -> Path:
    """``groups``: ``(label, mean, std, per-run BLEUs)``."""
    figure = _figure(max(4.0, 1.6 * len(groups) + 2), 4.5)
    axes = figure.add_subplot()
    positions = np.arange(len(groups))
    for x, (_, mean, std, values) in zip(positions, groups, strict=True):
        axes.errorbar([x], [mean], yerr=[0.0 if math.isnan(std) else std], fmt="o",
                      capsize=6, markersize=8, color="C0")
        axes.scatter([x + 0.12] * len(values), values, s=14, color="C1", zorder=3)
    axes.set_xticks(positions, labels=[g[0] for g in groups], rotation=20, ha="right",
                    fontsize=8)
    axes.set_xlim(-0.6, len(groups) - 0.4)
    axes.set_ylabel(f"{split} BLEU (mean ± std; dots: runs)")
    axes.grid(axis="y", alpha=0.3)
    return _save(figure, path)


def _lines_with_intervals(path: Path, labels: Sequence[str],
                          lines: Sequence[tuple[str, Mapping[str, tuple[float, float]]]], *,
                          ylabel: str) -> Path:
    """One line per group over the categories ``labels``: ``lines`` are ``(group, {label:
    (value, interval half-width)})``; a label a group lacks is left out of its line."""
    figure = _figure(6.5, 4.5)
    axes = figure.add_subplot()
    offsets = np.linspace(-0.15, 0.15, max(len(lines), 1))  # side by side, not on top
    for offset, (group, points) in zip(offsets, lines, strict=False):
        present = [(i, points[label]) for i, label in enumerate(labels) if label in points]
        axes.errorbar([i + offset for i, _ in present], [value for _, (value, _) in present],
                      yerr=[half for _, (_, half) in present], fmt="o-", capsize=4,
                      markersize=5, label=group)
    axes.set_xticks(range(len(labels)), labels=labels)
    axes.set_ylabel(ylabel)
    axes.grid(axis="y", alpha=0.3)
    _legend_below(axes, 7)
    return _save(figure, path)


def plot_length_buckets(path: Path, rows: Sequence[Mapping[str, Any]], *, split: str) -> Path:
    """``rows``: :func:`seq2seq.study.buckets.bucket_scores`'s, one line per group."""
    from seq2seq.study.buckets import LENGTH_BUCKETS, bucket_label

    return _lines_with_intervals(
        path, [f"{bucket_label(b)} words" for b in LENGTH_BUCKETS],
        [(row["group"], {f"{label} words": (score["bleu"], score["bleu_ci"])
                         for label, score in row["buckets"].items()}) for row in rows],
        ylabel=f"{split} BLEU (seeds pooled; 95% interval)")


def plot_positions(path: Path, rows: Sequence[Mapping[str, Any]], *, split: str) -> Path:
    """``rows``: :func:`seq2seq.study.positions.position_scores`'s, one line per group."""
    from seq2seq.study.positions import THIRDS

    return _lines_with_intervals(
        path, [f"{name} third" for name in THIRDS],
        [(row["group"], {f"{name} third": (third["accuracy"], third["ci"])
                         for name, third in row["thirds"].items()}) for row in rows],
        ylabel=f"{split} next-piece accuracy, teacher-forced (%)")


def plot_faithfulness(path: Path, rows: Sequence[Mapping[str, Any]], *, split: str) -> Path:
    """``rows``: ``{"group", "bleu", probe: {"bleu", ...}}`` means over seeds, a bar per
    decoding."""
    from seq2seq.study.faithfulness import PROBES

    decodings = [("model's weights", lambda row: row["bleu"])] + [
        (f"{probe} weights", lambda row, probe=probe: row[probe]["bleu"]) for probe in PROBES]
    figure = _figure(max(5.0, 1.3 * len(rows) + 2), 4.5)
    axes = figure.add_subplot()
    width = 0.8 / len(decodings)
    for number, (name, value) in enumerate(decodings):
        xs = np.arange(len(rows)) + (number - (len(decodings) - 1) / 2) * width
        axes.bar(xs, [value(row) for row in rows], width, label=name)
    axes.set_xticks(range(len(rows)), labels=[row["group"] for row in rows], rotation=20,
                    ha="right", fontsize=8)
    axes.set_ylabel(f"{split} BLEU (mean over seeds)")
    axes.grid(axis="y", alpha=0.3)
    axes.legend(fontsize=7)
    return _save(figure, path)


def plot_heatmaps(path: Path, heatmaps: Sequence[tuple[str, Mapping[str, Any]]]) -> Path:
    """``heatmaps``: ``(title, {"source_pieces", "target_pieces", "weights"})``, one panel each,
    at most four to a row; a title's comma-separated settings go one to a line."""
    columns = max(len(h["source_pieces"]) for _, h in heatmaps)
    rows = max(len(h["target_pieces"]) for _, h in heatmaps)
    panels_per_row = min(4, len(heatmaps))
    panel_rows = math.ceil(len(heatmaps) / panels_per_row)
    cell = 0.32
    width = min(max(cell * columns + 1.8, 3.5), 12.0) * panels_per_row
    height = min(max(cell * rows + 2.4, 4.0), 16.0) * panel_rows
    figure = _figure(min(width, 40.0), height)
    for index, (title, heatmap) in enumerate(heatmaps, start=1):
        axes = figure.add_subplot(panel_rows, panels_per_row, index)
        title = title.replace(", ", "\n")
        weights = np.asarray(heatmap["weights"], dtype=np.float32)
        image = axes.imshow(weights, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        axes.set_xticks(np.arange(weights.shape[1]), labels=heatmap["source_pieces"],
                        rotation=90, fontsize=8)
        axes.set_yticks(np.arange(weights.shape[0]), labels=heatmap["target_pieces"], fontsize=8)
        axes.xaxis.tick_top()
        axes.set_title(title, fontsize=9, pad=10)
    # Room between rows for the next row's title and source pieces.
    figure.subplots_adjust(hspace=0.55, wspace=0.45)
    figure.colorbar(image, ax=figure.axes, fraction=0.03, pad=0.02)
    return _save(figure, path)
