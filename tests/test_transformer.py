"""The Transformer's parts against the formulas they implement, and the Transformer in the
pipeline (training with mixed precision, tied embeddings, the unused attention node).

Cached = uncached decoding, padding invariance, gradients and learning the reversal task are
in test_models.py (the Transformer is among its combinations); batched = alone search in
test_search_loop.py; export equality in test_export.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from seq2seq import CONFIG_DIR
from seq2seq.checkpoint import load_checkpoint
from seq2seq.config_types import ConfigError
from seq2seq.models.build import build_model, check_model_config, uses_scorer
from seq2seq.models.interfaces import EncodedSource
from seq2seq.models.transformer import (
    MultiHeadAttention,
    TransformerDecoder,
    TransformerEncoder,
    TransformerEncoderLayer,
    embed,
    sinusoidal_positions,
)
from seq2seq.training.run import train


def test_sinusoidal_positions_follow_the_paper():
    dim = 6
    table = sinusoidal_positions(torch.arange(5), dim)
    for position in range(5):
        for i in range(dim // 2):
            angle = position / 10000 ** (2 * i / dim)
            assert table[position, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[position, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    # Positions are computed where asked: position 3 alone is row 3 of the table.
    torch.testing.assert_close(sinusoidal_positions(torch.tensor([3]), dim), table[3:4])


def torch_reference(attention: MultiHeadAttention) -> nn.MultiheadAttention:
    """torch's own multi-head attention with ``attention``'s weights."""
    d_model = attention.query_proj.out_features
    reference = nn.MultiheadAttention(d_model, attention.num_heads, batch_first=True)
    with torch.no_grad():
        reference.in_proj_weight.copy_(torch.cat([attention.query_proj.weight,
                                                  attention.key_proj.weight,
                                                  attention.value_proj.weight]))
        reference.in_proj_bias.copy_(torch.cat([attention.query_proj.bias,
                                                attention.key_proj.bias,
                                                attention.value_proj.bias]))
        reference.out_proj.weight.copy_(attention.out_proj.weight)
        reference.out_proj.bias.copy_(attention.out_proj.bias)
    return reference.eval()


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("masking", ["padding", "causal"])
def test_multi_head_attention_is_torchs_multi_head_attention(need_weights, masking):
    """Both paths (the fused kernel and the formula that returns the weights) give what
    ``nn.MultiheadAttention`` gives for the same weights, heads included."""
    torch.manual_seed(0)
    attention = MultiHeadAttention(d_model=8, num_heads=2).eval()
    reference = torch_reference(attention)
    x = torch.randn(3, 5, 8)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2, [True] + [False] * 4])
    keys, values = attention.project_keys_values(x)
    with torch.no_grad():
        if masking == "padding":
            got, weights = attention(x, keys, values, mask, need_weights=need_weights)
            want, want_weights = reference(x, x, x, key_padding_mask=~mask,
                                           average_attn_weights=False)
        else:
            got, weights = attention(x, keys, values, causal=True, need_weights=need_weights)
            future = torch.ones(5, 5, dtype=torch.bool).triu(1)
            want, want_weights = reference(x, x, x, attn_mask=future, average_attn_weights=False)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    if need_weights:
        torch.testing.assert_close(weights, want_weights, atol=1e-5, rtol=1e-5)
    else:
        assert weights is None


def test_encoder_layer_is_the_pre_norm_formula():
    torch.manual_seed(0)
    layer = TransformerEncoderLayer(8, 2, 16, dropout=0.0, attention_dropout=0.0).eval()
    reference = torch_reference(layer.self_attention)
    x = torch.randn(2, 4, 8)
    mask = torch.tensor([[True] * 4, [True, True, False, False]])
    with torch.no_grad():
        h = layer.self_attention_norm(x)
        x1 = x + reference(h, h, h, key_padding_mask=~mask)[0]
        ffn = layer.feed_forward
        h = layer.feed_forward_norm(x1)
        want = x1 + ffn[3](torch.relu(ffn[0](h)))  # W_2 ReLU(W_1 LN(x) + b_1) + b_2
        torch.testing.assert_close(layer(x, mask), want, atol=1e-5, rtol=1e-5)


def test_decoder_weights_average_every_head_of_every_layer():
    torch.manual_seed(0)
    encoder = TransformerEncoder(vocab_size=10, d_model=8, num_heads=2, num_layers=1,
                                 ffn_dim=16, dropout=0.0).eval()
    decoder = TransformerDecoder(vocab_size=10, encoder_output_size=8, d_model=8, num_heads=2,
                                 num_layers=2, ffn_dim=16, dropout=0.0).eval()
    src, lengths = torch.tensor([[4, 5, 6], [7, 8, 0]]), torch.tensor([3, 2])
    tgt_in = torch.tensor([[1, 4, 5], [1, 6, 0]])
    with torch.no_grad():
        memory, mask, final = encoder(src, lengths)
        encoded = EncodedSource(memory, mask, final, decoder.precompute_keys(memory))
        _, weights = decoder(tgt_in, encoded)
        per_layer = []
        x = embed(decoder.embedding, tgt_in, torch.arange(3))
        for number, layer in enumerate(decoder.layers):
            cross = (encoded.keys[:, number, 0], encoded.keys[:, number, 1])
            x, _, layer_weights = layer(x, None, cross, mask, need_weights=True)
            per_layer.append(layer_weights)  # (B, H, T, S)
    torch.testing.assert_close(weights, torch.stack(per_layer).mean(dim=(0, 2)))
    assert torch.all(weights[1, :, 2] == 0)  # the padded source position
    heads = decoder.attention_heads(tgt_in, encoded)  # (B, L, H, T, S): the picker's matrices
    torch.testing.assert_close(heads, torch.stack(per_layer, dim=1))
    _, no_weights = decoder(tgt_in, encoded, need_weights=False)
    assert no_weights is None


def transformer_config(**overrides):
    cfg = OmegaConf.create({
        "embed_dim": 16, "dropout": 0.0, "tie_embeddings": True,
        "encoder": OmegaConf.load(CONFIG_DIR / "model/encoder/transformer.yaml"),
        "decoder": OmegaConf.load(CONFIG_DIR / "model/decoder/transformer.yaml"),
        "attention": OmegaConf.load(CONFIG_DIR / "model/attention/additive.yaml"),
    })
    for node in (cfg.encoder, cfg.decoder):
        node.update(num_heads=2, num_layers=1, ffn_dim=32)
    root = OmegaConf.create({"model": cfg})
    root.merge_with({"model": overrides})
    return root.model


def test_the_transformer_decoder_takes_no_scorer_and_ties_its_embeddings():
    cfg = transformer_config()
    assert not uses_scorer(cfg.decoder)
    model = build_model(cfg, src_vocab_size=12, tgt_vocab_size=12)
    assert not any("scorer" in name for name, _ in model.named_parameters())
    assert model.generator.weight is model.decoder.embedding.weight
    assert model.generator.bias is None
    weight = model.generator.weight.detach()
    assert abs(weight[1:].std().item() - 16**-0.5) < 0.05  # N(0, 1/d): scaled, unit size


def test_the_transformer_preset_has_no_attention_node_and_an_rnn_decoder_needs_one():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        preset = compose("train", overrides=["experiment=multi30k_transformer"])
    assert "attention" not in preset.model  # model/attention=null: nothing unused in the config
    plain = OmegaConf.to_container(transformer_config(), resolve=True)
    del plain["attention"]
    check_model_config(plain)
    assert build_model(plain, src_vocab_size=12, tgt_vocab_size=12) is not None
    plain["decoder"] = {"_target_": "luong", "hidden_size": 8}
    with pytest.raises(ConfigError, match=r"model.attention: the decoder luong takes an "
                                          r"attention scorer; choose one, e.g. model/attention="):
        check_model_config(plain)


def test_odd_model_size_or_heads_that_do_not_divide_it_are_clear_errors():
    with pytest.raises(ValueError, match="d_model must be even"):
        TransformerEncoder(vocab_size=10, d_model=7, num_heads=1)
    with pytest.raises(ValueError, match=r"d_model \(8\) must be divisible by num_heads \(3\)"):
        TransformerEncoder(vocab_size=10, d_model=8, num_heads=3)


TRANSFORMER_TRAINING = {
    "model/encoder": "transformer", "model/decoder": "transformer",
    "model.encoder.hidden_size": None, "model.decoder.hidden_size": None,
    "model.encoder.num_layers": 1, "model.decoder.num_layers": 1,
    "model.encoder.ffn_dim": 64, "model.decoder.ffn_dim": 64, "model.tie_embeddings": True,
    "optimizer.lr": 0.003,
}


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_the_transformer_trains_through_the_loop_in_every_precision(tiny_train_config, tmp_path,
                                                                    precision, caplog):
    """The training loop, autocast (+ the grad scaler for fp16, the GPU path) and the
    validation's beam search over the cache, with train.py's own config groups."""
    cfg = tiny_train_config(**TRANSFORMER_TRAINING, **{
        "trainer.precision": precision, "trainer.max_steps": 6, "trainer.valid_every": 6,
        "trainer.valid.max_sentences": 8})
    assert cfg.model.encoder._target_ == "transformer"
    with caplog.at_level("INFO"):
        result = train(cfg, tmp_path / "run")
    assert any("the model.attention node (model/attention=...) is not used" in r.getMessage()
               for r in caplog.records)
    checkpoint = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert checkpoint["trainer_state"]["step"] == 6 and result["best_bleu"] >= 0
    for tensor in checkpoint["model"].values():
        assert tensor.dtype == torch.float32 and torch.isfinite(tensor).all()


class KeywordsDecoder:
    """A user's decoder that passes its arguments on (``**options``): it may take a scorer."""

    def __init__(self, *, extra: int = 0, **options) -> None:
        pass


def test_a_decoder_passing_keywords_on_is_given_a_scorer():
    assert uses_scorer({"_target_": f"{__name__}.KeywordsDecoder"})
    assert uses_scorer({"_target_": "luong"})
    assert not uses_scorer({"_target_": "transformer"})
    # A built-in named by its import path, as a user may: its signature answers.
    assert uses_scorer({"_target_": "seq2seq.models.decoders.LuongDecoder"})
    assert not uses_scorer({"_target_": "seq2seq.models.transformer.TransformerDecoder"})


def test_the_transformer_decoder_is_built_without_the_encoders_final_size():
    """Only a decoder that starts from the encoder's final state (the RNN decoders' bridge) is
    given its size; the Transformer decoder starts from an empty cache and takes no such
    argument."""
    with pytest.raises(TypeError, match="encoder_final_size"):
        TransformerDecoder(vocab_size=10, encoder_output_size=8, d_model=8, num_heads=2,
                           encoder_final_size=8)
    model = build_model(transformer_config(), src_vocab_size=12, tgt_vocab_size=12)
    assert isinstance(model.decoder, TransformerDecoder)
