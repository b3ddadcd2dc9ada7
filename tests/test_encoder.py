"""The encoder's two ways to skip padding (packed sequences, per-direction runs over the padded
batch) compute the same thing, and each is taken where it should be."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from torch import nn

from seq2seq.models.encoder import RNNEncoder, reversal_index

ROOT = Path(__file__).resolve().parents[1]
SHAPES = list(itertools.product(["gru", "lstm"], [1, 2], [True, False]))


def make_encoder(rnn_type: str, num_layers: int, bidirectional: bool, *, dropout: float = 0.0):
    torch.manual_seed(0)
    return RNNEncoder(vocab_size=30, embed_dim=8, hidden_size=6, num_layers=num_layers,
                      rnn_type=rnn_type, bidirectional=bidirectional, dropout=dropout)


def padded_batch():
    """Five rows of lengths 7, 3, 5, 1, 6 in a batch two positions wider than the longest."""
    lengths = torch.tensor([7, 3, 5, 1, 6])
    src = torch.randint(4, 30, (5, 9), generator=torch.Generator().manual_seed(1))
    src[torch.arange(9) >= lengths.unsqueeze(1)] = 0
    return src, lengths


def both_paths(encoder: RNNEncoder, src, lengths):
    """(memory, final) of the packed run, then of the padded run, each from its own graph."""
    mask = torch.arange(src.size(1)) < lengths.unsqueeze(1)
    return (encoder._run_packed(encoder.embedding(src), lengths),
            encoder._run_padded(encoder.embedding(src), lengths, mask))


def test_reversal_index_reverses_each_row_within_its_length_and_undoes_itself():
    index = reversal_index(torch.tensor([3, 1, 4]), 4)
    assert index.tolist() == [[2, 1, 0, 3], [0, 1, 2, 3], [3, 2, 1, 0]]
    assert torch.equal(index.gather(1, index), torch.arange(4).expand(3, 4))


@pytest.mark.parametrize(("rnn_type", "num_layers", "bidirectional"), SHAPES)
def test_padded_run_equals_packed_run(rnn_type, num_layers, bidirectional):
    encoder = make_encoder(rnn_type, num_layers, bidirectional).eval()
    src, lengths = padded_batch()
    with torch.no_grad():
        (packed_memory, packed_final), (memory, final) = both_paths(encoder, src, lengths)
    assert memory.shape == (5, 9, encoder.output_size) and final.shape == (5, encoder.output_size)
    torch.testing.assert_close(memory, packed_memory, atol=1e-6, rtol=0)
    torch.testing.assert_close(final, packed_final, atol=1e-6, rtol=0)
    assert not memory[torch.arange(9) >= lengths.unsqueeze(1)].any()  # zeros at padding


@pytest.mark.parametrize(("rnn_type", "num_layers", "bidirectional"), SHAPES)
def test_padded_run_gives_the_packed_runs_gradients(rnn_type, num_layers, bidirectional):
    encoder = make_encoder(rnn_type, num_layers, bidirectional).train()
    src, lengths = padded_batch()
    weights = torch.randn(5, 9, encoder.output_size)
    gradients = []
    for outputs in both_paths(encoder, src, lengths):
        encoder.zero_grad()
        memory, final = outputs
        ((memory * weights).sum() + final.square().sum()).backward()
        gradients.append({name: p.grad.clone() for name, p in encoder.named_parameters()})
    packed, padded = gradients
    for name in packed:
        torch.testing.assert_close(padded[name], packed[name], atol=1e-5, rtol=1e-5, msg=name)


def test_cpu_forward_runs_padded_and_quantized_layers_run_packed(monkeypatch):
    encoder = make_encoder("gru", 2, True).eval()
    src, lengths = padded_batch()
    with torch.no_grad():
        expected = encoder(src, lengths)

    def refuse(*args, **kwargs):
        raise AssertionError("packed path taken")

    with monkeypatch.context() as patch:
        patch.setattr(encoder, "_run_packed", refuse)
        with torch.no_grad():
            encoder(src, lengths)  # the CPU takes the padded path
    quantized = torch.ao.quantization.quantize_dynamic(encoder, {nn.GRU}, dtype=torch.qint8)
    assert type(quantized.rnn) is not nn.GRU
    monkeypatch.setattr(quantized, "_run_padded", refuse)
    with torch.no_grad():
        output = quantized(src, lengths)
    torch.testing.assert_close(output.memory, expected.memory, atol=0.05, rtol=0)


def test_padded_run_under_bf16_autocast_is_close_to_packed():
    encoder = make_encoder("gru", 1, True).eval()
    src, lengths = padded_batch()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        (packed_memory, packed_final), (memory, final) = both_paths(encoder, src, lengths)
    torch.testing.assert_close(memory.float(), packed_memory.float(), atol=2e-2, rtol=0)
    torch.testing.assert_close(final.float(), packed_final.float(), atol=2e-2, rtol=0)


def test_bench_encoder_times_both_paths_and_refuses_too_few_batches(run_python):
    script = [ROOT / "scripts" / "bench_encoder.py"]
    # Width 32: the paths are the same at any width, and 256 costs seconds per batch here.
    result = run_python([*script, "--batches", "12", "--hidden-size", "32"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("encoder forward + backward, fp32, 2 batches")
    assert sorted(line.split()[0] for line in lines[1:]) == ["packed", "padded"]
    refused = run_python([*script, "--batches", "10"])
    assert refused.returncode == 2 and "more than the 10 warm-up batches" in refused.stderr
