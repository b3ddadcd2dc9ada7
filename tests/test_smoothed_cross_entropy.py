"""smoothed_cross_entropy: the label-smoothed loss by blocks of rows equals the autograd formula.

The formula (``log_softmax``, ``gather``, ``mean``: ``seq2seq.training.loss``); the kernel must give
its loss, NLL and gradient: in float32 to rounding, in bf16 (logits and gradient rounded to
bf16, as under autocast) within bf16's rounding of the gradient. Blocks are made small so that
a batch spans several, the last one partial.
"""

from __future__ import annotations

import pytest
import torch

from seq2seq.ops import smoothed_cross_entropy as kernel
from seq2seq.ops.smoothed_cross_entropy import smoothed_cross_entropy
from seq2seq.training.loss import label_smoothed_formula as formula


def logits_and_targets(dtype: torch.dtype, rows: int = 23, width: int = 37, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    logits = (4 * torch.randn(rows, width, generator=generator)).to(dtype)
    targets = torch.randint(0, width, (rows,), generator=generator)
    return logits, targets


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocks_give_the_formulas_loss_nll_and_gradient(eps, dtype, monkeypatch):
    monkeypatch.setattr(kernel, "BLOCK_ELEMENTS", 5 * 37)  # blocks of 5 rows: 4 whole, 1 of 3
    logits, targets = logits_and_targets(dtype)
    weights = torch.rand(logits.size(0), generator=torch.Generator().manual_seed(1))

    fused = logits.clone().requires_grad_()
    loss, nll = smoothed_cross_entropy(fused, targets, eps)
    (loss * weights).sum().backward()
    plain = logits.clone().requires_grad_()
    expected_loss, expected_nll = formula(plain, targets, eps)
    (expected_loss * weights).sum().backward()

    assert loss.dtype == nll.dtype == torch.float32
    torch.testing.assert_close(loss, expected_loss, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(nll, expected_nll, rtol=1e-6, atol=1e-5)
    assert fused.grad.dtype == dtype
    # bf16 gradients: one rounding of a float32 value on each side (2^-8 relative)
    tolerance = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {
        "rtol": 2 ** -7, "atol": 1e-4}
    torch.testing.assert_close(fused.grad.float(), plain.grad.float(), **tolerance)
    assert not nll.requires_grad  # the NLL is for perplexity: it carries no gradient


def test_the_logits_are_left_as_they_were_and_large_ones_stay_finite():
    logits, targets = logits_and_targets(torch.float32)
    logits[0] = 1e4  # exp would overflow without subtracting the row's maximum
    logits[0, targets[0]] = -1e4
    kept = logits.clone()
    loss, nll = smoothed_cross_entropy(logits.requires_grad_(), targets, 0.1)
    loss.sum().backward()
    assert torch.equal(logits.detach(), kept)
    assert torch.isfinite(loss).all() and torch.isfinite(logits.grad).all()
    assert nll[0].item() == pytest.approx(2e4 + torch.log(torch.tensor(36.0)).item(), rel=1e-6)


def test_autocast_outside_does_not_change_the_result():
    logits, targets = logits_and_targets(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = smoothed_cross_entropy(logits, targets, 0.1)
    outside = smoothed_cross_entropy(logits, targets, 0.1)
    for a, b in zip(inside, outside, strict=True):
        assert torch.equal(a, b)
