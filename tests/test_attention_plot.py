"""Attention heatmaps: labelled axes, a PNG on disk, no global matplotlib state touched."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from seq2seq.inference.attention_plot import plot_attention, save_attention_plot

SOURCE = ["▁ein", "▁Hund", "</s>"]
TARGET = ["▁a", "▁dog", "▁runs", "</s>"]


def weights(rows: int = 4, columns: int = 3) -> np.ndarray:
    raw = np.random.default_rng(0).random((rows, columns))
    return raw / raw.sum(axis=1, keepdims=True)  # (T, S), rows sum to 1


def test_plot_labels_source_and_target_pieces():
    before = dict(matplotlib.rcParams)
    figure = plot_attention(weights(), SOURCE, TARGET, title="step 100")
    assert isinstance(figure, Figure)
    axes = figure.axes[0]
    assert [t.get_text() for t in axes.get_xticklabels()] == SOURCE
    assert [t.get_text() for t in axes.get_yticklabels()] == TARGET
    assert axes.get_title() == "step 100"
    assert axes.images[0].get_array().shape == (4, 3)
    assert dict(matplotlib.rcParams) == before


def test_save_writes_a_png_from_a_tensor(tmp_path):
    path = save_attention_plot(
        tmp_path / "plots" / "one.png", torch.from_numpy(weights()).float(), SOURCE, TARGET
    )
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_mismatched_labels_are_a_clear_error():
    with pytest.raises(ValueError, match="do not match 4 target and 2 source pieces"):
        plot_attention(weights(), SOURCE[:2], TARGET)
    with pytest.raises(ValueError, match="must be 2-D"):
        plot_attention(np.ones(3), SOURCE, TARGET)
