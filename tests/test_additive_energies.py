"""AdditiveEnergies (seq2seq.ops): v^T tanh(q + k) in chunks, against the tensor-at-once formula."""

from __future__ import annotations

import pytest
import torch

import seq2seq.ops.additive_energies as module
from seq2seq.models.attention import AdditiveScorer
from seq2seq.ops import speed_up
from seq2seq.ops.additive_energies import AdditiveEnergies, additive_energies


def _formula(query, keys, v_weight):
    return (torch.tanh(query.unsqueeze(2) + keys.unsqueeze(1)) @ v_weight[0]).float()


def _inputs(dtype=torch.float64, batch=5, steps=3, positions=4, size=6):
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(batch, steps, size, generator=generator, dtype=dtype)
    keys = torch.randn(batch, positions, size, generator=generator, dtype=dtype)
    v_weight = torch.randn(1, size, generator=generator, dtype=dtype)
    return [t.requires_grad_() for t in (query, keys, v_weight)]


@pytest.mark.parametrize("chunk_elements", [1, 3 * 4 * 6 * 2, 1 << 20])
def test_gradcheck_whatever_the_chunk_size(monkeypatch, chunk_elements):
    monkeypatch.setattr(module, "CHUNK_ELEMENTS", chunk_elements)
    assert torch.autograd.gradcheck(AdditiveEnergies.apply, _inputs())


def test_values_and_gradients_equal_the_formula_in_fp32():
    inputs = _inputs(torch.float32, batch=9, steps=7, positions=8, size=16)
    upstream = torch.randn(9, 7, 8, generator=torch.Generator().manual_seed(1))
    expected = _formula(*inputs)
    expected_grads = torch.autograd.grad((expected * upstream).sum(), inputs)
    got = additive_energies(*inputs)
    got_grads = torch.autograd.grad((got * upstream).sum(), inputs)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    for mine, theirs in zip(got_grads, expected_grads, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)


def test_bf16_inputs_give_bf16_energies_close_to_fp32():
    inputs = _inputs(torch.float32, batch=4, steps=5, positions=6, size=32)
    expected = _formula(*inputs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        query, keys = inputs[0].bfloat16(), inputs[1].bfloat16()
        got = additive_energies(query, keys, inputs[2])
    assert got.dtype == torch.bfloat16
    scale = expected.abs().max()
    assert (got.float() - expected).abs().max() <= 0.05 * scale
    got.float().sum().backward()
    assert inputs[0].grad.dtype == torch.float32 and torch.isfinite(inputs[0].grad).all()
    assert inputs[2].grad is not None and torch.isfinite(inputs[2].grad).all()


def test_mixed_dtypes_compute_in_the_wider_one():
    query, keys, v_weight = _inputs(torch.float32)
    got = additive_energies(query.bfloat16(), keys, v_weight)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, _formula(query, keys, v_weight), atol=0.1, rtol=0.05)


# Softmax error limits: the constant subtracted after rounding gave 0.09 (bf16) and 0.011
# (fp16) here; as the product's bias, 0.009 and 0.001 (tanh at once in bf16: 0.007).
@pytest.mark.parametrize(("dtype", "limit"), [(torch.bfloat16, 0.03), (torch.float16, 0.004)])
def test_half_precision_keeps_its_precision_when_v_sums_to_a_large_number(dtype, limit):
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(64, 1, 512, generator=generator)
    keys = torch.randn(64, 20, 512, generator=generator)
    v_weight = 0.1 * torch.randn(1, 512, generator=generator) + 0.2  # sum(v) about 100
    exact = torch.softmax(_formula(query.double(), keys.double(), v_weight.double()), -1)
    got = additive_energies(query.to(dtype), keys.to(dtype), v_weight.to(dtype))
    assert got.dtype == dtype
    error = (torch.softmax(got.double(), -1) - exact).abs().max()
    assert error < limit


def test_the_swapped_scorer_in_chunks_equals_the_plain_one(monkeypatch):
    """The energies come a few rows at a time, with autograd or without; they equal the plain
    scorer's v^T tanh(q + k) built at once."""
    torch.manual_seed(0)
    plain = AdditiveScorer(query_dim=6, key_dim=4, hidden_size=5).double()
    swapped = speed_up(AdditiveScorer(query_dim=6, key_dim=4, hidden_size=5).double())
    swapped.load_state_dict(plain.state_dict())
    query = torch.randn(7, 2, 6, dtype=torch.float64)
    keys = plain.precompute_keys(torch.randn(7, 3, 4, dtype=torch.float64))
    formula = plain.score(query, keys)
    monkeypatch.setattr(module, "CHUNK_ELEMENTS", 2 * 3 * 5 * 2)  # 2 rows a chunk
    training = swapped.score(query, keys)
    with torch.inference_mode():
        searching = swapped.score(query, keys)
    assert training.requires_grad and not searching.requires_grad
    torch.testing.assert_close(training, formula)
    torch.testing.assert_close(searching, formula.detach())
