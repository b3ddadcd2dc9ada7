"""seq2seq/models/dropout.py: the CPU dropout with an int16 mask."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import seq2seq.models.dropout as dropout_module
from seq2seq.models.dropout import LEVELS, Dropout, dropout


@pytest.fixture(autouse=True)
def int16_masks(monkeypatch):
    """The int16 mask whatever this CPU is (on Intel + MKL torch's own runs instead)."""
    monkeypatch.setattr(dropout_module, "torch_draws_masks_serially", lambda: True)


def test_identity_when_not_training_or_no_probability():
    x = torch.randn(4, 5)
    assert dropout(x, 0.3, training=False) is x
    assert dropout(x, 0.0, training=True) is x
    layer = Dropout(0.3).eval()
    assert layer(x) is x


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5])
def test_drops_at_the_rate_and_scales_the_rest_exactly(p):
    torch.manual_seed(0)
    x = torch.full((1_000_000,), 3.0)
    y = dropout(x, p, training=True)
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.003
    scale = LEVELS / (LEVELS - round(p * LEVELS))
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 3.0 * scale))
    assert abs(y.mean().item() - 3.0) < 0.02  # expectation unchanged


def test_gradient_is_the_scaled_mask_and_dtype_is_kept():
    torch.manual_seed(0)
    x = torch.randn(64, 32, requires_grad=True)
    y = dropout(x, 0.25, training=True)
    y.sum().backward()
    scale = LEVELS / (LEVELS - round(0.25 * LEVELS))
    torch.testing.assert_close(x.grad, (y != 0).float() * scale)
    half = dropout(torch.randn(8, 8, dtype=torch.bfloat16), 0.2, training=True)
    assert half.dtype == torch.bfloat16


def test_repeatable_under_a_seed_and_p_one_drops_everything():
    x = torch.randn(100)
    torch.manual_seed(5)
    first = dropout(x, 0.2, training=True)
    torch.manual_seed(5)
    torch.testing.assert_close(dropout(x, 0.2, training=True), first)
    assert not dropout(x, 1.0, training=True).any()
    # Rounds to the last level: torch's dropout takes it (no division by zero).
    assert dropout(x, 0.99999, training=True).isfinite().all()
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.5)
    with pytest.raises(ValueError, match="dropout probability"):
        dropout(x, -0.1, training=True)


def test_torchs_dropout_where_its_mask_is_not_the_serial_one(monkeypatch):
    calls = []
    monkeypatch.setattr(dropout_module, "torch_draws_masks_serially", lambda: False)
    monkeypatch.setattr(dropout_module.F, "dropout", lambda x, p, training: calls.append(p) or x)
    dropout(torch.randn(10), 0.2, training=True)
    assert calls == [0.2]


def test_the_models_use_it_instead_of_torchs(tiny_model):
    model = tiny_model()
    assert any(isinstance(module, Dropout) for module in model.encoder.modules())
    assert any(isinstance(module, Dropout) for module in model.decoder.modules())
    assert not any(isinstance(module, nn.Dropout) for module in model.modules())
