"""The Translator on a tiny model trained (in the test) to copy its input.

The helpers at the top also serve tests/test_cli_inference.py and
tests/test_checkpoint_safety.py: a synthetic corpus, a tiny checkpoint with everything a real
one carries, and a copy model trained once per test session (a few seconds).
"""

from __future__ import annotations

import functools
import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from seq2seq import CONFIG_DIR
from seq2seq.checkpoint import (
    FORMAT_VERSION,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
    tokenizers_to_payload,
)
from seq2seq.data.batching import collate
from seq2seq.data.tokenizer import SentencePieceTokenizer, Tokenizers
from seq2seq.data.vocab import PAD_ID
from seq2seq.inference.search import Hypothesis, greedy_search
from seq2seq.inference.translator import Translation, Translator
from seq2seq.models.build import build_model

CONFIGS = CONFIG_DIR
WORDS = [
    "red",
    "blue",
    "green",
    "cat",
    "dog",
    "house",
    "tree",
    "car",
    "big",
    "small",
    "one",
    "two",
    "bird",
    "fish",
    "sun",
    "moon",
]
SPLIT_SIZES = {"train": 2000, "valid": 40, "test": 60}


# -- helpers shared with the other inference tests -----------------------------------------
def sentences(count: int, *, seed: int) -> list[str]:
    """Random sentences of 2-7 words from a 16-word vocabulary."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 7))) for _ in range(count)]


def write_corpus(directory: Path) -> dict[str, dict[str, str]]:
    """A copy-task corpus under ``directory/corpus``; returns the paths relative to ``directory``.

    The paths are relative on purpose: the data config of a checkpoint is read relative to the
    directory a command runs in.
    """
    (directory / "corpus").mkdir(parents=True, exist_ok=True)
    files = {}
    for seed, (split, count) in enumerate(SPLIT_SIZES.items()):
        lines = sentences(count, seed=seed)
        for side in ("src", "tgt"):
            relative = f"corpus/{split}.{side}"
            (directory / relative).write_text("".join(f"{line}\n" for line in lines), "utf-8")
        files[split] = {"src": f"corpus/{split}.src", "tgt": f"corpus/{split}.tgt"}
    return files


def model_config(*, decoder_hidden_size: int = 64) -> dict:
    """The real YAML groups (GRU encoder, Bahdanau decoder, additive attention), made tiny."""
    cfg = OmegaConf.create(
        {
            "model": {
                "embed_dim": 32,
                "dropout": 0.0,
                "tie_embeddings": False,
                "encoder": OmegaConf.load(CONFIGS / "model/encoder/gru.yaml"),
                "decoder": OmegaConf.load(CONFIGS / "model/decoder/bahdanau.yaml"),
                "attention": OmegaConf.load(CONFIGS / "model/attention/additive.yaml"),
            }
        }
    )
    cfg.model.encoder.hidden_size = 32
    cfg.model.decoder.hidden_size = decoder_hidden_size
    return OmegaConf.to_container(cfg, resolve=True)["model"]


@functools.cache
def tokenizers() -> Tokenizers:
    """A joint unigram model: on this corpus every word becomes one piece."""
    shared = SentencePieceTokenizer.train(
        sentences(SPLIT_SIZES["train"], seed=0),
        model_type="unigram",
        vocab_size=39,
        seed=1,
        max_sentences=0,
    )
    return Tokenizers(src=shared, tgt=shared, joint=True)


def checkpoint_payload(model, data_files: dict, model_cfg: dict | None = None) -> dict:
    """Everything a trainer's checkpoint carries, minus the training-only extras."""
    return {
        "format_version": FORMAT_VERSION,
        "model": model.state_dict(),
        "config": {
            "model": model_cfg or model_config(),
            "data": {"kind": "files", "src_lang": "src", "tgt_lang": "tgt", **data_files},
            "tokenizer": {"model_type": "unigram", "vocab_size": 39, "joint": True},
            "paths": {"data_dir": "data", "cache_dir": "data/cache"},
        },
        "tokenizers": tokenizers_to_payload(tokenizers()),
        "optimizer": {"state": {}, "param_groups": []},
    }


def make_checkpoint(
    directory: Path, *, train_steps: int = 0, name: str = "last.pt", decoder_hidden_size: int = 64
) -> Path:
    """Write ``directory/checkpoints/<name>`` (and the corpus) for a tiny model.

    With ``train_steps``, the model is first trained on the copy task (300 steps: ~5 s).
    """
    data_files = write_corpus(directory)
    model_cfg = model_config(decoder_hidden_size=decoder_hidden_size)
    vocab_size = tokenizers().src.vocab_size
    torch.manual_seed(0)
    model = build_model(
        OmegaConf.create(model_cfg), src_vocab_size=vocab_size, tgt_vocab_size=vocab_size
    )
    if train_steps:
        train_copy_task(model, steps=train_steps)
    path = directory / "checkpoints" / name
    save_checkpoint(checkpoint_payload(model.eval(), data_files, model_cfg), path)
    return path


def train_copy_task(model, *, steps: int) -> None:
    ids = [np.asarray(x) for x in tokenizers().src.encode(sentences(SPLIT_SIZES["train"], seed=0))]
    rng = random.Random(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=PAD_ID)
    model.train()
    # Matrices this small run fastest on one thread, and the test machine's cores are shared.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _copy_steps(model, ids, rng, optimizer, loss_fn, steps)
    finally:
        torch.set_num_threads(threads)
    model.eval()


def _copy_steps(model, ids, rng, optimizer, loss_fn, steps: int) -> None:
    for _ in range(steps):
        picked = [rng.randrange(len(ids)) for _ in range(32)]
        batch = collate([(ids[i], ids[i]) for i in picked], picked)
        features, _ = model(batch.src, batch.src_lengths, batch.tgt_in)
        loss = loss_fn(model.project(features).flatten(0, 1), batch.tgt_out.flatten())
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()


@functools.cache
def _trained_checkpoint(session_dir: Path) -> Path:
    return make_checkpoint(session_dir / "copy_model", train_steps=300, name="best.pt")


def trained_checkpoint(tmp_path_factory) -> Path:
    """The copy model's checkpoint, trained once per session (its corpus lies beside it)."""
    return _trained_checkpoint(tmp_path_factory.getbasetemp())


# -- tests -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def translator(tmp_path_factory) -> Translator:
    return Translator.from_checkpoint(trained_checkpoint(tmp_path_factory), beam_size=4)


def test_copy_model_translates(translator):
    inputs = sentences(30, seed=123)
    outputs = [n_best[0].text for n_best in translator.translate(inputs)]
    assert sum(o == i for o, i in zip(outputs, inputs, strict=True)) >= 25


def test_order_count_empty_and_long_lines(translator, caplog):
    long_line = " ".join(["red cat"] * 200)  # 400 pieces
    inputs = ["blue dog", "", "one two three sun", long_line, "   ", "big house"]
    with caplog.at_level(logging.WARNING, logger="seq2seq.inference.translator"):
        results = translator.translate(inputs)
    assert len(results) == len(inputs)
    assert results[0][0].text == "blue dog" and results[5][0].text == "big house"
    for index in (1, 4):
        assert results[index] == [Translation("", 0.0, [], [], None)]
    assert len(results[3][0].source_pieces) == translator.max_source_length == 250
    assert results[3][0].attention.shape[1] == 251  # the cut source and its EOS
    assert "source sentence 4 has 400 pieces" in caplog.text


def test_results_do_not_depend_on_batching(tmp_path_factory):
    path = trained_checkpoint(tmp_path_factory)
    inputs = sentences(12, seed=7) + [""]
    big = Translator.from_checkpoint(path, beam_size=3, max_tokens=4000).translate(inputs)
    small = Translator.from_checkpoint(path, beam_size=3, max_tokens=1).translate(inputs)
    for a, b in zip(big, small, strict=True):
        assert a[0].text == b[0].text
        assert a[0].score == pytest.approx(b[0].score, abs=1e-5)


def test_translation_fields_and_attention(translator):
    (best,) = translator.translate(["green bird sun"])[0]
    assert best.text == "green bird sun"
    assert best.source_pieces == best.target_pieces == ["▁green", "▁bird", "▁sun"]
    assert best.attention.shape == (4, 4)  # 3 pieces + EOS on both sides
    torch.testing.assert_close(best.attention.sum(-1), torch.ones(4))
    assert best.score < 0


def test_nbest_sorted_and_distinct(tmp_path_factory):
    path = trained_checkpoint(tmp_path_factory)
    translator = Translator.from_checkpoint(path, beam_size=4, nbest=3)
    for n_best in translator.translate(sentences(5, seed=9)):
        assert len(n_best) == 3
        assert [t.score for t in n_best] == sorted((t.score for t in n_best), reverse=True)
        assert len({t.text for t in n_best}) == 3


def test_translate_ids_greedy_path_matches_greedy_search(tmp_path_factory):
    checkpoint = load_checkpoint(trained_checkpoint(tmp_path_factory))
    model, tokenizers_, _ = model_from_checkpoint(checkpoint)
    ids = [np.asarray(x, dtype=np.uint16) for x in tokenizers_.src.encode(sentences(6, seed=5))]
    translator = Translator(model, tokenizers_, device="cpu", beam_size=1, length_penalty=0.0)
    model.train()  # the trainer lends its model in training mode...
    results = translator.translate_ids(ids, return_attention=True)
    assert model.training  # ...and gets it back that way
    model.eval()
    batch = collate([(x, x) for x in ids], list(range(len(ids))))
    expected = greedy_search(
        model,
        batch.src,
        batch.src_lengths,
        max_len_a=1.5,
        max_len_b=10,
        length_penalty=0.0,
        return_attention=True,
    )
    for got, want in zip(results, expected, strict=True):
        assert isinstance(got[0], Hypothesis)
        assert got[0].tokens == want[0].tokens
        assert got[0].score == pytest.approx(want[0].score, abs=1e-5)
        torch.testing.assert_close(got[0].attention, want[0].attention)
    assert translator.translate_ids([np.array([], dtype=np.int64)]) == [[Hypothesis([], 0.0, None)]]


def test_invalid_options_are_clear_errors(translator):
    with pytest.raises(ValueError, match="nbest must be between 1 and beam_size"):
        Translator(translator.model, translator.tokenizers, device="cpu", beam_size=2, nbest=3)
    with pytest.raises(ValueError, match="max_tokens must be positive"):
        Translator(translator.model, translator.tokenizers, device="cpu", max_tokens=0)
