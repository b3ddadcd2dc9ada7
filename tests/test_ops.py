"""speed_up: the kernels of seq2seq.ops swapped into a built model change its speed only.

A swapped model gives the plain model's outputs and gradients (same weights), keeps its
parameters, state_dict keys and printed names, and swapping twice changes nothing. A user's
subclass that computes a method itself keeps it. The plain decoders leave the state a
transposed view; the swapped ones copy it contiguous (what bf16 products on CPUs need).
"""

from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf
from torch.nn.attention import SDPBackend

from benchmarks import bench_ops
from seq2seq import CONFIG_DIR
from seq2seq.data.vocab import BOS_ID, PAD_ID
from seq2seq.models.attention import AdditiveScorer, Attention, DotScorer
from seq2seq.models.build import build_model
from seq2seq.models.decoders import BahdanauDecoder
from seq2seq.models.interfaces import EncodedSource
from seq2seq.ops import KERNELS, speed_up
from seq2seq.ops.additive_energies import ChunkedAdditiveScorer
from seq2seq.ops.contiguous_state import ContiguousState
from seq2seq.ops.mask_dropout import MaskDropout

VOCAB = 12


def tiny_model(decoder: str, attention: str, rnn_type: str = "gru", seed: int = 0):
    """A two-layer decoder (the state's layers are what the contiguity kernel is about)."""
    cfg = OmegaConf.create({
        "embed_dim": 16, "dropout": 0.0, "tie_embeddings": False,
        "encoder": OmegaConf.load(CONFIG_DIR / "model/encoder/gru.yaml"),
        "decoder": OmegaConf.load(CONFIG_DIR / f"model/decoder/{decoder}.yaml"),
        "attention": OmegaConf.load(CONFIG_DIR / f"model/attention/{attention}.yaml"),
    })
    cfg.encoder.hidden_size = 8
    cfg.decoder.update(hidden_size=16, num_layers=2, rnn_type=rnn_type)
    if attention == "multihead":  # its inner scorer is the additive one
        cfg.attention.heads = 2
    root = OmegaConf.create({"model": cfg})
    torch.manual_seed(seed)
    return build_model(root.model, src_vocab_size=VOCAB, tgt_vocab_size=VOCAB)


def batch():
    generator = torch.Generator().manual_seed(1)
    src_lengths = torch.tensor([7, 4, 6, 2])
    src = torch.randint(4, VOCAB, (4, 7), generator=generator)
    src[torch.arange(7) >= src_lengths.unsqueeze(1)] = PAD_ID
    tgt_in = torch.randint(4, VOCAB, (4, 5), generator=generator)
    tgt_in[:, 0] = BOS_ID
    return src, src_lengths, tgt_in


def loss_and_grads(model):
    features, weights = model(*batch())
    loss = model.project(features).log_softmax(-1).mean() + weights.square().mean()
    loss.backward()
    return features, weights, {name: p.grad for name, p in model.named_parameters()}


CASES = [("bahdanau", "additive", "gru"), ("bahdanau", "additive", "lstm"),
         ("luong", "additive", "gru"), ("bahdanau", "multihead", "gru"),
         ("luong", "dot", "lstm")]


@pytest.mark.parametrize(("decoder", "attention", "rnn_type"), CASES)
def test_swapped_model_gives_the_plain_outputs_and_gradients(decoder, attention, rnn_type):
    plain = tiny_model(decoder, attention, rnn_type).double()
    swapped = speed_up(copy.deepcopy(plain))
    assert isinstance(swapped.decoder, ContiguousState)
    for got, expected in zip(loss_and_grads(swapped), loss_and_grads(plain), strict=True):
        torch.testing.assert_close(got, expected)


def test_every_additive_scorer_is_swapped_multihead_inner_included():
    model = speed_up(tiny_model("bahdanau", "multihead"))
    scorers = [m for m in model.modules() if isinstance(m, AdditiveScorer)]
    assert scorers and all(isinstance(m, ChunkedAdditiveScorer) for m in scorers)


def test_swapping_keeps_parameters_state_dict_and_names():
    plain = tiny_model("bahdanau", "additive")
    state = {name: value.clone() for name, value in plain.state_dict().items()}
    parameters = list(plain.parameters())
    printed = repr(plain)
    swapped = speed_up(plain)
    assert swapped is plain
    assert list(swapped.parameters()) == parameters  # the same tensors, so an optimizer's too
    assert list(swapped.state_dict()) == list(state)
    for name, value in swapped.state_dict().items():
        assert torch.equal(value, state[name])
    assert repr(swapped) == printed
    assert type(swapped.decoder).__name__ == "BahdanauDecoder"
    # A swapped model's weights load into a plain one and back.
    tiny_model("bahdanau", "additive", seed=3).load_state_dict(swapped.state_dict())
    swapped.load_state_dict(tiny_model("bahdanau", "additive", seed=3).state_dict())


def test_speed_up_is_idempotent_and_one_class_per_model_class():
    model = speed_up(tiny_model("bahdanau", "additive"))
    classes = [type(m) for m in model.modules()]
    speed_up(model)
    assert [type(m) for m in model.modules()] == classes
    other = speed_up(tiny_model("bahdanau", "additive", seed=1))
    assert type(other.decoder) is type(model.decoder)
    assert type(other.decoder.attention.scorer) is type(model.decoder.attention.scorer)
    assert type(model.decoder).__mro__[1:3] == (ContiguousState, BahdanauDecoder)


def test_a_subclass_that_scores_itself_keeps_its_score():
    class Halved(AdditiveScorer):
        def score(self, query, keys):
            return super().score(query, keys) / 2

    class Renamed(AdditiveScorer):
        pass

    halved, renamed = Halved(query_dim=4, key_dim=4), Renamed(query_dim=4, key_dim=4)
    speed_up(halved)
    speed_up(renamed)
    assert type(halved) is Halved
    assert isinstance(renamed, Renamed) and isinstance(renamed, ChunkedAdditiveScorer)


@pytest.mark.parametrize("rnn_type", ["gru", "lstm"])
def test_swapped_decoders_keep_their_state_contiguous(rnn_type):
    """Bahdanau queries the state's top layer. Sliced from the plain decoder's transposed view,
    the query (B, 1, H) steps B * H elements between its (one) step: strides with which bf16
    matrix products on CPUs broadcast the weight per sentence. The swapped decoder copies the
    state contiguous (two layers, so the view is not), and the query steps H."""
    batch, hidden = 6, 8
    seen = []

    class Spy(DotScorer):
        def score(self, query, keys):
            seen.append(query.stride(1))
            return super().score(query, keys)

    decoder = BahdanauDecoder(vocab_size=10, embed_dim=4, hidden_size=hidden, num_layers=2,
                              attention=Attention(Spy(query_dim=hidden, key_dim=8)),
                              encoder_output_size=8, encoder_final_size=8, rnn_type=rnn_type)
    memory = torch.randn(batch, 5, 8)
    encoded = EncodedSource(memory=memory, mask=torch.ones(batch, 5, dtype=torch.bool),
                            final=torch.randn(batch, 8), keys=memory)
    for swapped, step in ((False, batch * hidden), (True, hidden)):
        if swapped:
            speed_up(decoder)
        seen.clear()
        state = decoder.init_state(encoded.final)
        for _ in range(3):
            _, _, state = decoder.step(torch.full((batch,), 4), state, encoded)
        assert seen[1:] == [step] * 2  # the first query is the initial state's
        assert all(value.is_contiguous() == swapped for value in state.values())


def test_kernels_can_be_swapped_one_at_a_time():
    model = speed_up(tiny_model("bahdanau", "additive"), ["contiguous_state"])
    assert isinstance(model.decoder, ContiguousState)
    assert not isinstance(model.decoder.attention.scorer, ChunkedAdditiveScorer)
    speed_up(model, ["additive_energies"])
    assert isinstance(model.decoder.attention.scorer, ChunkedAdditiveScorer)
    with pytest.raises(ValueError, match="unknown kernels"):
        speed_up(model, ["fused_everything"])


@pytest.mark.parametrize("mode", ["train", "beam"])
def test_bench_ops_compares_plain_and_swapped(mode, capsys):
    tiny = ["experiment=multi30k_gru_additive", "model.embed_dim=8",
            "model.encoder.hidden_size=8", "model.decoder.hidden_size=16", "batch.max_tokens=60"]
    result = bench_ops.main([*tiny, "--mode", mode, "--steps", "2", "--clock", "wall"])
    assert result["plain"] > 0 and result["swapped"] > 0 and result["ratio"] > 0
    alone = bench_ops.main([*tiny, "--steps", "1", "--only", "plain", "--kernels", *KERNELS])
    assert set(alone) == {"plain", "peak_mib"}
    assert "swapped/plain" in capsys.readouterr().out


def test_float32_attention_runs_half_precision_attention_in_float32_on_a_cpu():
    from seq2seq.models.transformer import MultiHeadAttention
    from seq2seq.ops.float32_attention import Float32Attention

    torch.manual_seed(0)
    plain = MultiHeadAttention(d_model=16, num_heads=2)
    swapped = speed_up(copy.deepcopy(plain), ["float32_attention"])
    assert isinstance(swapped, Float32Attention) and not isinstance(plain, Float32Attention)
    query, keys, values = (torch.randn(3, 2, 5, 8) for _ in range(3))
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2, [True] * 4 + [False]])
    for causal, given_mask in ((False, mask), (True, None)):
        half = [tensor.bfloat16() for tensor in (query, keys, values)]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            context = swapped.attend(*half, given_mask, causal=causal, dropout=0.0)
        expected = plain.attend(*(tensor.float() for tensor in half), given_mask, causal=causal,
                                dropout=0.0)
        assert context.dtype == torch.bfloat16
        assert torch.equal(context, expected.bfloat16())
        # float32 inputs: the plain call itself
        assert torch.equal(swapped.attend(query, keys, values, given_mask, causal=causal,
                                          dropout=0.0),
                           plain.attend(query, keys, values, given_mask, causal=causal,
                                        dropout=0.0))


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mask_dropout_keeps_each_element_with_one_minus_p_and_scales_it(dtype, p):
    dropout = speed_up(torch.nn.Sequential(torch.nn.Dropout(p)), ["mask_dropout"])[0]
    x = (torch.rand(400, 500) + 1).to(dtype).requires_grad_()  # no zeros of its own
    torch.manual_seed(1)
    out = dropout(x)
    torch.manual_seed(1)
    assert torch.equal(dropout(x), out)  # seeded: the same mask
    kept = out != 0
    # each of the four 16-bit parts of a 64-bit draw is uniform (the generator's default range
    # would leave one part's sign bit at 0, and a quarter of the elements kept more often)
    for part in range(4):
        assert abs(kept.flatten()[part::4].float().mean().item() - (1 - p)) < 0.01
    assert torch.equal(out[kept], (x * (1 / (1 - p))).to(dtype)[kept])
    out.backward(torch.ones_like(out))
    assert torch.equal(x.grad, torch.where(kept, torch.tensor(1 / (1 - p)).to(dtype), 0))
    dropout.eval()
    assert dropout(x) is x


def test_a_dropout_subclass_with_its_own_forward_keeps_it():
    """mask_dropout computes forward anew: a subclass that computes its own is left alone."""
    class Halving(torch.nn.Dropout):
        def forward(self, x):
            return x / 2

    class Renamed(torch.nn.Dropout):
        pass

    model = speed_up(torch.nn.Sequential(Halving(0.3), Renamed(0.3)), ["mask_dropout"])
    assert type(model[0]) is Halving and isinstance(model[1], MaskDropout)
    assert torch.equal(model[0](torch.ones(3)), torch.full((3,), 0.5))


def test_cuda_attention_leaves_out_cudnn_on_a_gpu_and_nothing_else(monkeypatch):
    """cuDNN's attention builds a plan per new shape (about 180 ms on an H200 against 0.9 for the
    memory-efficient kernel, docs/results.md#gpu-check): on CUDA the fused call runs among the
    other backends; elsewhere it is the plain call. (tests/test_gpu_check.py checks the GPU.)"""
    import contextlib

    from seq2seq.models.transformer import MultiHeadAttention
    from seq2seq.ops import cuda_attention

    class OnCuda(torch.Tensor):  # a CPU tensor that says it is on a GPU
        @property
        def device(self):
            return torch.device("cuda")

    chosen = []
    monkeypatch.setattr(cuda_attention, "sdpa_kernel",
                        lambda backends: chosen.append(backends) or contextlib.nullcontext())
    torch.manual_seed(0)
    plain = MultiHeadAttention(d_model=16, num_heads=2)
    swapped = speed_up(copy.deepcopy(plain), ["cuda_attention"])
    query, keys, values = (torch.randn(3, 2, 5, 8) for _ in range(3))
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2, [True] * 4 + [False]])
    expected = plain.attend(query, keys, values, mask, causal=False, dropout=0.0)
    assert torch.equal(swapped.attend(query, keys, values, mask, causal=False, dropout=0.0),
                       expected)
    assert chosen == []
    on_gpu = swapped.attend(*(t.as_subclass(OnCuda) for t in (query, keys, values)), mask,
                            causal=False, dropout=0.0)
    assert chosen == [cuda_attention.WITHOUT_CUDNN]
    assert SDPBackend.CUDNN_ATTENTION not in chosen[0]
    assert torch.equal(on_gpu.as_subclass(torch.Tensor), expected)
    # With every kernel, both attention mixins stack: half precision on a CPU still in float32.
    from seq2seq.ops.float32_attention import Float32Attention

    every = speed_up(copy.deepcopy(plain))
    assert isinstance(every, cuda_attention.CudaAttention) and isinstance(every, Float32Attention)
    half = [tensor.bfloat16() for tensor in (query, keys, values)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        stacked = every.attend(*half, mask, causal=False, dropout=0.0)
    assert torch.equal(stacked, plain.attend(*(t.float() for t in half), mask, causal=False,
                                             dropout=0.0).bfloat16())
