"""Encoder x decoder x scorer: equivalence of the two decoding paths, masking, learning."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from omegaconf import OmegaConf

from seq2seq import CONFIG_DIR
from seq2seq.config_types import check_config
from seq2seq.data.vocab import BOS_ID, EOS_ID, PAD_ID
from seq2seq.models.attention import NORMALIZERS
from seq2seq.models.build import build_model, split_attention_config
from seq2seq.models.interfaces import EncodedSource, select_state

CONFIGS = CONFIG_DIR
ENCODERS = ["gru", "lstm"]
DECODERS = ["bahdanau", "luong", "luong_no_feed"]
SCORERS = ["additive", "dot", "scaled_dot", "general", "multihead"]
# Newer scorers and sparsemax ("scorer+normalizer"): every decoder, one encoder, to keep the
# product (and the learning test's minute) small; the encoder does not touch attention.
NEW_SCORERS = ["gaussian", "epanechnikov", "location", "additive+sparsemax",
               "multihead+sparsemax", "gaussian+sparsemax"]
# The Transformer: with its own decoder (which takes no scorer: "-"), its encoder under an RNN
# decoder with a scorer, and an RNN encoder under its decoder.
TRANSFORMERS = [("transformer", "transformer", "-"), ("transformer", "luong", "additive"),
                ("transformer", "bahdanau", "multihead"), ("lstm", "transformer", "-")]
COMBINATIONS = [
    *itertools.product(ENCODERS, DECODERS, SCORERS),
    *itertools.product(["gru"], DECODERS, NEW_SCORERS),
    *TRANSFORMERS,
]
# Learning is slow (seconds each): every scorer with one encoder and decoder, every decoder and
# encoder with one scorer. The structural tests above cover the full product.
LEARNING = [
    *itertools.product(["gru"], ["luong"], SCORERS + NEW_SCORERS),
    *itertools.product(["gru"], ["bahdanau", "luong_no_feed"], ["additive"]),
    *itertools.product(["lstm"], DECODERS, ["general"]),
    ("transformer", "transformer", "-"),
    ("transformer", "luong", "general"),
]
VOCAB = 12  # 0-3 are special, 4-11 are "words"


def model_config(encoder_type: str, decoder_type: str, scorer_type: str, **overrides):
    """The real YAML files of the three groups, shrunk to a tiny model.

    ``scorer_type`` names an attention YAML, or ``epanechnikov`` (gaussian.yaml with that
    kernel), optionally with ``+sparsemax`` for that normalizer; ``-`` for the Transformer
    decoder, which does not use one (the additive file stands in the unused node).
    """
    encoder, decoder = encoder_type, decoder_type
    scorer, _, normalizer = scorer_type.partition("+")
    kernel = "epanechnikov" if scorer == "epanechnikov" else None
    scorer = "gaussian" if kernel else scorer
    scorer = "additive" if scorer == "-" else scorer
    decoder_file = "luong" if decoder.startswith("luong") else decoder
    cfg = OmegaConf.create(
        {
            "embed_dim": 16,
            "dropout": 0.0,
            "tie_embeddings": False,
            "encoder": OmegaConf.load(CONFIGS / f"model/encoder/{encoder}.yaml"),
            "decoder": OmegaConf.load(CONFIGS / f"model/decoder/{decoder_file}.yaml"),
            "attention": OmegaConf.load(CONFIGS / f"model/attention/{scorer}.yaml"),
        }
    )
    # Bidirectional 8: memory vectors of 16, like the Transformer's d_model (embed_dim).
    for node, hidden_size in ((cfg.encoder, 8), (cfg.decoder, 16)):
        if "transformer" in node._target_:
            node.update(num_heads=2, num_layers=2, ffn_dim=32)
        else:
            node.hidden_size = hidden_size
    if decoder == "luong_no_feed":
        cfg.decoder.input_feeding = False
    if scorer == "multihead":
        cfg.attention.heads = 2
    if kernel:
        cfg.attention.kernel = kernel
    if normalizer:
        cfg.attention.normalizer = normalizer
    # The group files interpolate ${model.*}; resolve them against this small root.
    root = OmegaConf.create({"model": cfg})
    root.merge_with({"model": overrides})
    return root.model


def make_model(encoder_type, decoder_type, scorer_type, seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = model_config(encoder_type, decoder_type, scorer_type, **overrides)
    return build_model(cfg, src_vocab_size=VOCAB, tgt_vocab_size=VOCAB)


def random_batch(batch_size=4, max_len=7, seed=1):
    generator = torch.Generator().manual_seed(seed)
    src_lengths = torch.randint(1, max_len + 1, (batch_size,), generator=generator)
    src_lengths[0] = max_len  # at least one full row; others padded
    src = torch.full((batch_size, max_len), PAD_ID)
    for i, length in enumerate(src_lengths.tolist()):
        src[i, :length] = torch.randint(4, VOCAB, (length,), generator=generator)
    tgt_in = torch.randint(4, VOCAB, (batch_size, 5), generator=generator)
    tgt_in[:, 0] = BOS_ID
    return src, src_lengths, tgt_in


@pytest.mark.parametrize(("encoder", "decoder", "scorer"), COMBINATIONS)
def test_teacher_forcing_equals_step_by_step(encoder, decoder, scorer):
    model = make_model(encoder, decoder, scorer).eval()
    src, src_lengths, tgt_in = random_batch()
    with torch.no_grad():
        features, weights = model(src, src_lengths, tgt_in)
        logits = model.project(features)  # (B, T, V)
        encoded = model.encode(src, src_lengths)
        state = model.init_state(encoded)
        for t in range(tgt_in.size(1)):
            step_logits, step_weights, state = model.decode_step(tgt_in[:, t], state, encoded)
            torch.testing.assert_close(step_logits, logits[:, t], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(step_weights, weights[:, t], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("encoder", "decoder", "scorer"), COMBINATIONS)
def test_padding_gets_zero_weight_and_changes_nothing(encoder, decoder, scorer):
    model = make_model(encoder, decoder, scorer).eval()
    src, src_lengths, tgt_in = random_batch()
    padded = torch.arange(src.size(1)).unsqueeze(0) >= src_lengths.unsqueeze(1)  # (B, S)
    assert padded.any()
    with torch.no_grad():
        features, weights = model(src, src_lengths, tgt_in)
        assert torch.all(weights.masked_select(padded.unsqueeze(1).expand_as(weights)) == 0)
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:2]))
        garbage = src.masked_scatter(padded, torch.randint(4, VOCAB, (int(padded.sum()),)))
        features_garbage, weights_garbage = model(garbage, src_lengths, tgt_in)
    assert not torch.equal(garbage, src)
    torch.testing.assert_close(features_garbage, features, atol=1e-6, rtol=0)
    torch.testing.assert_close(weights_garbage, weights, atol=1e-6, rtol=0)


@pytest.mark.parametrize(("encoder", "decoder", "scorer"), COMBINATIONS)
def test_every_parameter_gets_a_gradient(encoder, decoder, scorer):
    model = make_model(encoder, decoder, scorer).train()
    src, src_lengths, tgt_in = random_batch()
    features, _ = model(src, src_lengths, tgt_in)
    model.project(features).logsumexp(-1).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    assert not missing, f"no gradient for {missing}"


@pytest.mark.parametrize(("encoder", "decoder", "scorer"), COMBINATIONS)
def test_batch_of_one_and_source_of_length_one(encoder, decoder, scorer):
    model = make_model(encoder, decoder, scorer).eval()
    src = torch.tensor([[5]])
    with torch.no_grad():
        features, weights = model(src, torch.tensor([1]), torch.tensor([[BOS_ID, 6, 7]]))
        encoded = model.encode(src, torch.tensor([1]))
        logits, step_weights, _ = model.decode_step(
            torch.tensor([BOS_ID]), model.init_state(encoded), encoded
        )
    assert features.shape == (1, 3, model.decoder.output_dim)
    assert torch.allclose(weights, torch.ones(1, 3, 1))
    assert logits.shape == (1, VOCAB) and step_weights.shape == (1, 1)


def reversal_batch(generator, batch_size=32):
    """Random words 4..11 of length 2..6; the target is the source reversed."""
    lengths = torch.randint(2, 7, (batch_size,), generator=generator)
    src = torch.full((batch_size, 7), PAD_ID)
    tgt_in = torch.full((batch_size, 7), PAD_ID)
    tgt_out = torch.full((batch_size, 7), PAD_ID)
    for i, length in enumerate(lengths.tolist()):
        words = torch.randint(4, VOCAB, (length,), generator=generator)
        src[i, :length], src[i, length] = words, EOS_ID
        tgt_in[i, 0], tgt_in[i, 1 : length + 1] = BOS_ID, words.flip(0)
        tgt_out[i, :length], tgt_out[i, length] = words.flip(0), EOS_ID
    return src, lengths + 1, tgt_in, tgt_out


@pytest.mark.slow
@pytest.mark.parametrize(("encoder", "decoder", "scorer"), LEARNING)
def test_learns_to_reverse(encoder, decoder, scorer):
    """Each combination learns to reverse: a held-out loss under 0.1 nats a piece, in at most
    300 steps.

    Batches of 128 get there in 40-70 steps (seed 0; batches of 32 needed 100-350 steps, each
    costing over half as much, a step this small being mostly per-call overhead). A control with
    the dot scorer's energies zeroed (uniform weights) needed 150, a fixed-size summary being
    enough for sequences this short: this proves learning, not the attention's share in it.
    """
    torch.set_num_threads(1)  # tiny tensors: threads only add overhead
    sizes = {"transformer": {"ffn_dim": 64}, "encoder": {"hidden_size": 32},
             "decoder": {"hidden_size": 64}}
    model = make_model(
        encoder, decoder, scorer, embed_dim=32,
        encoder=sizes["transformer" if encoder == "transformer" else "encoder"],
        decoder=sizes["transformer" if decoder == "transformer" else "decoder"],
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=PAD_ID)
    held_out_batch = reversal_batch(torch.Generator().manual_seed(99), 256)

    def held_out_loss() -> float:
        model.eval()
        with torch.no_grad():
            src, src_lengths, tgt_in, tgt_out = held_out_batch
            features, _ = model(src, src_lengths, tgt_in)
            loss = loss_fn(model.project(features).flatten(0, 1), tgt_out.flatten()).item()
        model.train()
        return loss

    for step in range(1, 301):
        src, src_lengths, tgt_in, tgt_out = reversal_batch(generator, 128)
        features, _ = model(src, src_lengths, tgt_in)
        loss = loss_fn(model.project(features).flatten(0, 1), tgt_out.flatten())
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 10 == 0 and held_out_loss() < 0.1:
            break
    final = held_out_loss()
    assert final < 0.1, f"held-out loss {final:.3f} after {step} steps"


def test_tied_embeddings_share_the_matrix():
    model = make_model("gru", "luong", "general", tie_embeddings=True)
    assert model.generator.weight is model.decoder.embedding.weight
    assert model.decoder.output_dim == model.decoder.embedding.embedding_dim
    weight = model.generator.weight.detach()
    # Initialised for its role as output layer (std 1/sqrt(d)), padding row zero.
    assert abs(weight[1:].std().item() - 16**-0.5) < 0.05
    assert not weight[0].any()


def test_index_select_reorders_encoded_source_and_state():
    model = make_model("lstm", "luong", "additive").eval()
    src, src_lengths, _ = random_batch()
    encoded = model.encode(src, src_lengths)
    order = torch.tensor([2, 2, 0])
    picked = encoded.index_select(order)
    assert isinstance(picked, EncodedSource)
    assert torch.equal(picked.memory, encoded.memory[order])
    state = select_state(model.init_state(encoded), order)
    assert all(value.size(0) == 3 for value in state.values())


@pytest.mark.parametrize("normalizer", ["softmax", "sparsemax"])
def test_builder_gives_the_normalizer_to_attention_not_the_scorer(normalizer):
    cfg = OmegaConf.to_container(model_config("gru", "luong", "gaussian"), resolve=True)
    cfg["attention"]["normalizer"] = normalizer
    before = copy.deepcopy(cfg)
    model = build_model(cfg, src_vocab_size=VOCAB, tgt_vocab_size=VOCAB)
    assert model.decoder.attention.normalizer == normalizer
    assert type(model.decoder.attention.scorer).__name__ == "GaussianScorer"
    assert cfg == before  # the config (saved in checkpoints) keeps its normalizer


def test_missing_normalizer_means_softmax():
    cfg = OmegaConf.to_container(model_config("gru", "luong", "general"), resolve=True)
    del cfg["attention"]["normalizer"]  # a config from before the option existed
    model = build_model(cfg, src_vocab_size=VOCAB, tgt_vocab_size=VOCAB)
    assert model.decoder.attention.normalizer == "softmax"


@pytest.mark.parametrize("file", sorted(p.stem for p in (CONFIGS / "model/attention").glob("*.yaml")))
def test_attention_configs_without_builder_keys_fit_the_scorer_signature(file):
    node = OmegaConf.to_container(OmegaConf.load(CONFIGS / f"model/attention/{file}.yaml"))
    scorer_node, normalizer = split_attention_config(node)
    assert normalizer in NORMALIZERS
    check_config(scorer_node, "model.attention")


def test_unknown_normalizer_fails_at_build_time():
    with pytest.raises(ValueError, match="normalizer must be one of softmax, sparsemax"):
        make_model("gru", "luong", "general", attention={"normalizer": "entmax"})


def test_unknown_rnn_type_is_a_clear_error():
    cfg = model_config("gru", "bahdanau", "additive")
    cfg.encoder.rnn_type = "transformer"
    with pytest.raises(Exception, match="rnn_type must be one of"):
        build_model(cfg, src_vocab_size=VOCAB, tgt_vocab_size=VOCAB)


def test_word_dropout_replaces_pieces_with_unk_and_keeps_specials():
    from seq2seq.data.vocab import UNK_ID
    from seq2seq.models.seq2seq import drop_words

    torch.manual_seed(0)
    tokens = torch.randint(4, VOCAB, (64, 40))
    tokens[:, 0] = BOS_ID
    tokens[:, 30] = EOS_ID
    tokens[:, 31:] = PAD_ID
    dropped = drop_words(tokens, 0.25)
    changed = dropped != tokens
    assert (dropped[changed] == UNK_ID).all()
    assert not changed[:, [0, 30]].any() and not changed[:, 31:].any()
    rate = changed[:, 1:30].float().mean().item()
    assert 0.2 < rate < 0.3, rate
    assert torch.equal(drop_words(tokens, 0.0), tokens)


def test_word_dropout_acts_in_training_only():
    src, src_lengths, tgt_in = random_batch(batch_size=16)
    plain = make_model("gru", "luong", "additive")
    dropping = make_model("gru", "luong", "additive", word_dropout=0.5)
    assert dropping.word_dropout == 0.5
    torch.manual_seed(3)
    trained = dropping.train()(src, src_lengths, tgt_in)[0]
    assert not torch.allclose(trained, plain.train()(src, src_lengths, tgt_in)[0])
    with torch.no_grad():
        assert torch.equal(dropping.eval()(src, src_lengths, tgt_in)[0],
                           plain.eval()(src, src_lengths, tgt_in)[0])


@pytest.mark.parametrize("value", [1.0, -0.1, "high", True])
def test_bad_word_dropout_is_a_config_error(value):
    from seq2seq.config_types import ConfigError
    from seq2seq.models.build import check_model_config

    cfg = OmegaConf.to_container(model_config("gru", "luong", "general"), resolve=True)
    cfg["word_dropout"] = value
    with pytest.raises(ConfigError, match=r"model\.word_dropout must be a number in \[0, 1\)"):
        check_model_config(cfg)
