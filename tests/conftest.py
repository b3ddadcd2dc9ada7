"""Shared fixtures and helpers of the test suite; test modules never import each other.

Data preparation:
    ``write_parallel``, ``small_corpus``, ``toy_pairs``: small synthetic corpora in tmp_path.
Training:
    ``train_corpus``: a word-for-word toy language in tmp_path (BLEU rises within 100 steps);
    ``tiny_train_config``: the real ``train.yaml`` over that corpus, shrunk to seconds on one
    CPU thread (``tiny_train_config(**overrides)`` composes it, ``.overrides(**overrides)``
    gives the command-line form for ``train.py``); ``fake_validation_bleu``: make the
    validations report a given sequence of BLEUs.
Inference:
    ``copy_sentences``: sentences of the copy task; ``make_checkpoint``: writes a checkpoint
    with everything a real one carries (and its corpus); ``trained_checkpoint``: a copy model
    trained once per test session, shared by all pytest-xdist workers (read it, never write);
    ``greedy_search``, ``beam_search``: the one loop with ``Greedy()`` or ``Beam(beam_size)``.
Scripts:
    ``run_python``: runs ``translate.py``, ``train.py``, ``-m seq2seq.cli.average``,
    ``-m benchmarks.bench`` ... as ``subprocess.run``/``Popen`` would, in processes forked
    from one that has imported torch (tests/python_runner.py); tests about import order,
    console scripts and torchrun start a real interpreter. ``run_tool``: ``run_python`` as
    the CLI tests run the tools.

Every test runs on one torch thread (``one_thread``): the models are tiny and the machine's
cores are shared between the xdist workers.
"""

from __future__ import annotations

import functools
import gzip
import os
import random
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import DictConfig, OmegaConf
from python_runner import PreloadedPython

import seq2seq.cli.common  # noqa: F401  (gives Hydra the decoding options, as every tool does)
from seq2seq import CONFIG_DIR

# -- data preparation corpora ----------------------------------------------------------------
# Syllables of a toy language: enough structure for sentencepiece to learn merges.
_SYLLABLES = ["ka", "lo", "mi", "nu", "pe", "ra", "si", "to", "ve", "zu", "bar", "den", "fol"]


def make_words(rng: random.Random, count: int) -> list[str]:
    """A vocabulary of `count` distinct toy words built from syllables."""
    words: set[str] = set()
    while len(words) < count:
        words.add("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))))
    return sorted(words)


def make_pairs(
    rng: random.Random, count: int, *, min_words: int = 3, max_words: int = 12
) -> list[tuple[str, str]]:
    """Sentence pairs whose target is the source's words reversed and upper-cased.

    Both sides have the same words, so with a joint model they have the same number of
    pieces: no pair of these trips the length-ratio filter.
    """
    words = make_words(rng, 60)
    pairs = []
    for _ in range(count):
        sentence = [rng.choice(words) for _ in range(rng.randint(min_words, max_words))]
        pairs.append((" ".join(sentence), " ".join(reversed(sentence))))
    return pairs


def write_lines(path: Path, lines: Sequence[str]) -> Path:
    """Writes one line per entry, UTF-8, gzip-compressed when the name ends in .gz."""
    data = "".join(f"{line}\n" for line in lines).encode("utf-8")
    if path.suffix == ".gz":
        # mtime=0: identical content gives identical bytes, hence identical checksums.
        with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as file:
            file.write(data)
    else:
        path.write_bytes(data)
    return path


WriteParallel = Callable[..., tuple[Path, Path]]


@pytest.fixture
def write_parallel(tmp_path: Path) -> WriteParallel:
    """Returns write(name, pairs, *, suffix="") -> (src_path, tgt_path) under tmp_path/corpus."""
    directory = tmp_path / "corpus"
    directory.mkdir(exist_ok=True)

    def write(
        name: str, pairs: Sequence[tuple[str, str]], *, suffix: str = ""
    ) -> tuple[Path, Path]:
        src = write_lines(directory / f"{name}.src{suffix}", [src for src, _ in pairs])
        tgt = write_lines(directory / f"{name}.tgt{suffix}", [tgt for _, tgt in pairs])
        return src, tgt

    return write


@pytest.fixture
def small_corpus(write_parallel: WriteParallel) -> dict[str, tuple[Path, Path]]:
    """train (400 pairs, gzip), valid (60) and test (50) splits of the toy language."""
    rng = random.Random(1234)
    return {
        "train": write_parallel("train", make_pairs(rng, 400), suffix=".gz"),
        "valid": write_parallel("valid", make_pairs(rng, 60)),
        "test": write_parallel("test", make_pairs(rng, 50)),
    }


@pytest.fixture
def toy_pairs() -> Callable[..., list[tuple[str, str]]]:
    """Returns pairs(seed, count, **options): `make_pairs` with a fresh seeded generator."""

    def pairs(seed: int, count: int, **options: int) -> list[tuple[str, str]]:
        return make_pairs(random.Random(seed), count, **options)

    return pairs


# -- training: a tiny composed train.yaml ----------------------------------------------------
LEXICON_WORDS = ["ka", "lo", "mi", "nu", "pe", "ra", "si", "to", "ve", "zu", "bar", "den"]


def write_lexicon_corpus(
    directory: Path, name: str, count: int, *, seed: int, words: Sequence[str] = LEXICON_WORDS
) -> tuple[Path, Path]:
    """A word-for-word "language": each source word has one target word, same order."""
    rng = random.Random(seed)
    sources, targets = [], []
    for _ in range(count):
        sentence = [rng.choice(words) for _ in range(rng.randint(2, 6))]
        sources.append(" ".join(sentence))
        targets.append(" ".join(word[::-1].upper() + "x" for word in sentence))
    src, tgt = directory / f"{name}.src", directory / f"{name}.tgt"
    src.write_text("\n".join(sources) + "\n", encoding="utf-8")
    tgt.write_text("\n".join(targets) + "\n", encoding="utf-8")
    return src, tgt


@pytest.fixture
def train_corpus(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    """train (600 pairs) and valid (40) splits of the word-for-word language, in tmp_path."""
    directory = tmp_path / "corpus"
    directory.mkdir(exist_ok=True)
    return {
        "train": write_lexicon_corpus(directory, "train", 600, seed=1),
        "valid": write_lexicon_corpus(directory, "valid", 40, seed=2),
    }


def compose_train_config(overrides: Sequence[str]) -> DictConfig:
    """``train.yaml`` composed with Hydra's compose API, as ``train.py`` would compose it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


class TinyTrainConfig:
    """The real train config over ``corpus``, shrunk to a run of seconds on one CPU thread.

    ``config(**extra)`` composes it (``extra``: dotted keys, e.g.
    ``**{"trainer.max_steps": 20}``; a value of None leaves the key out),
    ``config.overrides(**extra)`` lists the same as ``key=value`` arguments of ``train.py``.
    """

    def __init__(self, corpus: dict[str, tuple[Path, Path]], data_dir: Path) -> None:
        self.corpus = corpus
        self.data_dir = data_dir

    def overrides(self, **extra) -> list[str]:
        values = {
            "data": "files",
            "data.train.src": self.corpus["train"][0],
            "data.train.tgt": self.corpus["train"][1],
            "data.valid.src": self.corpus["valid"][0],
            "data.valid.tgt": self.corpus["valid"][1],
            "paths.data_dir": self.data_dir,
            "tokenizer.vocab_size": 60,
            "model.embed_dim": 32,
            "model.dropout": 0.1,
            "model.encoder.hidden_size": 32,
            "model.decoder.hidden_size": 64,
            "batch.max_tokens": 400,
            "trainer.num_threads": 1,
            "trainer.max_epochs": 100,
            "trainer.max_steps": 60,
            "trainer.log_every": 20,
            "trainer.valid_every": 30,
            "trainer.save_every": 20,
            "trainer.progress_bar": False,
            # The heatmap costs ~0.4 s of matplotlib per validation; the TensorBoard test
            # turns it back on.
            "trainer.valid.attention_plot_index": -1,
            "optimizer.lr": 0.01,
        }
        values.update(extra)
        # None drops a key (a group without it, e.g. model/encoder=transformer's hidden_size).
        return [f"{key}={value}" for key, value in values.items() if value is not None]

    def __call__(self, **extra) -> DictConfig:
        return compose_train_config(self.overrides(**extra))


@pytest.fixture
def tiny_train_config(train_corpus, tmp_path: Path) -> TinyTrainConfig:
    """A factory of tiny train configs over ``train_corpus``; data caches go to tmp_path/data."""
    return TinyTrainConfig(train_corpus, tmp_path / "data")


@pytest.fixture
def fake_validation_bleu(monkeypatch) -> Callable[[Sequence[float]], list[float]]:
    """Returns fake(bleus): the validations that follow report these BLEUs, in turn.

    The translations are still made, written and scored; only the BLEU of the scores is
    replaced (in :mod:`seq2seq.inference.evaluation`, which validation and ``evaluate.py``
    share). ``fake`` returns the list of BLEUs handed out so far, for the test to check that
    every validation went through the fake.
    """
    from seq2seq.inference import evaluation

    real_scores = evaluation.corpus_scores
    handed_out: list[float] = []

    def fake(bleus: Sequence[float]) -> list[float]:
        def corpus_scores(hypotheses, references):
            if len(handed_out) >= len(bleus):
                raise AssertionError(f"more than the {len(bleus)} validations the test expected")
            scores = dict(real_scores(hypotheses, references))
            scores["bleu"] = float(bleus[len(handed_out)])
            handed_out.append(scores["bleu"])
            return scores

        monkeypatch.setattr(evaluation, "corpus_scores", corpus_scores)
        return handed_out

    return fake


# -- a tiny GRU + Luong + additive model, built without Hydra ---------------------------------
TINY_VOCAB = 20  # ids 0-3 are special, 4-19 are "words"


def padded_random_sources(batch_size: int, *, vocab: int, max_len: int = 7, seed: int = 1):
    """Padded random sources ending in EOS, as the translator builds them: ids 4..vocab-1,
    lengths 1..max_len-1 plus EOS. Returns ``(src (B, max_len), src_lengths (B,))``."""
    from seq2seq.data.vocab import EOS_ID, PAD_ID

    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len, (batch_size,), generator=generator)
    src = torch.full((batch_size, max_len), PAD_ID)
    for row, length in enumerate(lengths.tolist()):
        src[row, :length] = torch.randint(4, vocab, (length,), generator=generator)
        src[row, length] = EOS_ID
    return src, lengths + 1


@pytest.fixture(scope="session")
def tiny_model() -> Callable[..., torch.nn.Module]:
    """Returns build(seed=0): a small deterministic model (dropout 0) over ``TINY_VOCAB`` ids."""
    from seq2seq.models.build import build_model

    def build(seed: int = 0) -> torch.nn.Module:
        torch.manual_seed(seed)
        config = {
            "embed_dim": 16, "dropout": 0.0, "tie_embeddings": False,
            "encoder": {"_target_": "rnn", "rnn_type": "gru",
                        "embed_dim": 16, "hidden_size": 8, "num_layers": 1,
                        "bidirectional": True, "dropout": 0.0},
            "decoder": {"_target_": "luong", "rnn_type": "gru",
                        "embed_dim": 16, "hidden_size": 16, "num_layers": 1, "dropout": 0.0,
                        "bridge": True, "input_feeding": True, "output_dim": None},
            "attention": {"_target_": "additive", "hidden_size": None},
        }
        return build_model(config, src_vocab_size=TINY_VOCAB, tgt_vocab_size=TINY_VOCAB)

    return build


def random_luong_model(rnn_type: str = "gru", *, vocab: int = 20, input_feeding: bool = True,
                       num_layers: int = 1, decoder: str = "luong", encoder_layers: int = 1,
                       bidirectional: bool = True, attention: str = "additive",
                       attention_options: dict | None = None, output_dim: int | None = None,
                       seed: int = 0) -> torch.nn.Module:
    """A random tiny model (encoder 8 a direction, decoder 16) from the real YAML groups
    (``attention`` names a file of ``model/attention``, ``attention_options`` overrides its
    keys), in eval mode, with flat outputs."""
    from seq2seq.data.vocab import EOS_ID
    from seq2seq.models.build import build_model

    torch.manual_seed(seed)
    cfg = OmegaConf.create({
        "embed_dim": 12,
        "dropout": 0.0,
        "tie_embeddings": False,
        "encoder": OmegaConf.load(CONFIG_DIR / f"model/encoder/{rnn_type}.yaml"),
        "decoder": OmegaConf.load(CONFIG_DIR / f"model/decoder/{decoder}.yaml"),
        "attention": OmegaConf.load(CONFIG_DIR / f"model/attention/{attention}.yaml"),
    })
    cfg.encoder.hidden_size = 8
    cfg.encoder.num_layers = encoder_layers
    cfg.encoder.bidirectional = bidirectional
    cfg.decoder.hidden_size = 16
    cfg.decoder.rnn_type = rnn_type
    cfg.decoder.num_layers = num_layers
    if decoder == "luong":
        cfg.decoder.input_feeding = input_feeding
        cfg.decoder.output_dim = output_dim
    for key, value in (attention_options or {}).items():
        cfg.attention[key] = value
    model_cfg = OmegaConf.create({"model": cfg}).model  # resolves the ${model.*} interpolations
    model = build_model(model_cfg, src_vocab_size=vocab, tgt_vocab_size=vocab).eval()
    with torch.no_grad():  # flatter outputs: many near-competitive continuations
        model.generator.weight.mul_(3.0)
        model.generator.bias[EOS_ID] -= 2.0
    return model


def transformer_model_config(*, num_layers: int = 2, tie_embeddings: bool = True) -> dict:
    """The real Transformer YAML groups, made tiny (d_model 12, 2 heads), resolved."""
    cfg = OmegaConf.create({"model": {
        "embed_dim": 12, "dropout": 0.0, "tie_embeddings": tie_embeddings,
        "encoder": OmegaConf.load(CONFIG_DIR / "model/encoder/transformer.yaml"),
        "decoder": OmegaConf.load(CONFIG_DIR / "model/decoder/transformer.yaml"),
        # Not used by the Transformer decoder; there as in every composed config.
        "attention": OmegaConf.load(CONFIG_DIR / "model/attention/additive.yaml"),
    }})
    for node in (cfg.model.encoder, cfg.model.decoder):
        node.update(num_heads=2, num_layers=num_layers, ffn_dim=24)
    return OmegaConf.to_container(cfg, resolve=True)["model"]


def random_transformer_model(*, vocab: int = 20, num_layers: int = 2, seed: int = 0,
                             tie_embeddings: bool = True, **_) -> torch.nn.Module:
    """A random tiny Transformer (:func:`transformer_model_config`) in eval mode, with flat
    outputs."""
    from seq2seq.models.build import build_model

    torch.manual_seed(seed)
    model_cfg = transformer_model_config(num_layers=num_layers, tie_embeddings=tie_embeddings)
    model = build_model(model_cfg, src_vocab_size=vocab, tgt_vocab_size=vocab).eval()
    with torch.no_grad():  # flatter outputs: many near-competitive continuations
        model.generator.weight.mul_(3.0)
    return model


def transformer_checkpoint(directory: Path, *, seed: int = 0) -> Path:
    """A random untied tiny Transformer (varied outputs) over the copy corpus and tokenizers,
    saved as ``directory/transformer.pt``."""
    from seq2seq.checkpoint import save_checkpoint

    model = random_transformer_model(vocab=39, seed=seed, tie_embeddings=False)
    payload = checkpoint_payload(model, write_copy_corpus(directory),
                                 transformer_model_config(tie_embeddings=False))
    path = directory / "transformer.pt"
    save_checkpoint(payload, path)
    return path


def assert_same_hypotheses(got, expected, *, score_tolerance: float = 1e-5) -> None:
    """Two searches' n-best lists: the same tokens, scores within ``score_tolerance`` and, where
    both have them, the same attention weights."""
    assert len(got) == len(expected)
    for want, have in zip(expected, got, strict=True):
        assert [h.tokens for h in have] == [h.tokens for h in want]
        for a, b in zip(have, want, strict=True):
            assert a.score == pytest.approx(b.score, abs=score_tolerance)
            if a.attention is not None or b.attention is not None:
                torch.testing.assert_close(a.attention, b.attention)


def greedy_search(model, src, src_lengths, **settings):
    """The one loop with greedy search's strategy (``settings``: :func:`run_search`'s)."""
    from seq2seq.inference.search_loop import Greedy, run_search

    return run_search(model, src, src_lengths, Greedy(), **settings)


def beam_search(model, src, src_lengths, *, beam_size: int, **settings):
    """The one loop with beam search's strategy at ``beam_size``."""
    from seq2seq.inference.search_loop import Beam, run_search

    return run_search(model, src, src_lengths, Beam(beam_size), **settings)


# -- inference: the copy task ----------------------------------------------------------------
COPY_WORDS = ["red", "blue", "green", "cat", "dog", "house", "tree", "car", "big", "small",
              "one", "two", "bird", "fish", "sun", "moon"]
COPY_SPLIT_SIZES = {"train": 2000, "valid": 40, "test": 60}


def sentences(count: int, *, seed: int) -> list[str]:
    """Random sentences of 2-7 words from a 16-word vocabulary."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(COPY_WORDS) for _ in range(rng.randint(2, 7)))
            for _ in range(count)]


def write_copy_corpus(directory: Path) -> dict[str, dict[str, str]]:
    """A copy-task corpus under ``directory/corpus``; returns the paths relative to ``directory``.

    The paths are relative on purpose: the data config of a checkpoint is read relative to the
    directory a command runs in.
    """
    (directory / "corpus").mkdir(parents=True, exist_ok=True)
    files = {}
    for seed, (split, count) in enumerate(COPY_SPLIT_SIZES.items()):
        lines = sentences(count, seed=seed)
        for side in ("src", "tgt"):
            relative = f"corpus/{split}.{side}"
            (directory / relative).write_text("".join(f"{line}\n" for line in lines), "utf-8")
        files[split] = {"src": f"corpus/{split}.src", "tgt": f"corpus/{split}.tgt"}
    return files


def copy_model_config(*, decoder_hidden_size: int = 64, attention: str = "additive") -> dict:
    """The real YAML groups (GRU encoder, Bahdanau decoder, ``attention``), made tiny."""
    cfg = OmegaConf.create(
        {
            "model": {
                "embed_dim": 32,
                "dropout": 0.0,
                "tie_embeddings": False,
                "encoder": OmegaConf.load(CONFIG_DIR / "model/encoder/gru.yaml"),
                "decoder": OmegaConf.load(CONFIG_DIR / "model/decoder/bahdanau.yaml"),
                "attention": OmegaConf.load(CONFIG_DIR / f"model/attention/{attention}.yaml"),
            }
        }
    )
    cfg.model.encoder.hidden_size = 32
    cfg.model.decoder.hidden_size = decoder_hidden_size
    return OmegaConf.to_container(cfg, resolve=True)["model"]


@functools.cache
def copy_tokenizers():
    """A joint unigram model: on the copy corpus every word becomes one piece."""
    from seq2seq.data.tokenizer import SentencePieceTokenizer, Tokenizers

    shared = SentencePieceTokenizer.train(
        sentences(COPY_SPLIT_SIZES["train"], seed=0),
        model_type="unigram",
        vocab_size=39,
        seed=1,
        max_sentences=0,
    )
    return Tokenizers(src=shared, tgt=shared, joint=True)


def checkpoint_payload(model, data_files: dict, model_cfg: dict | None = None) -> dict:
    """Everything a trainer's checkpoint carries, minus the training-only extras."""
    from seq2seq.checkpoint import FORMAT_VERSION, tokenizers_to_payload

    return {
        "format_version": FORMAT_VERSION,
        "model": model.state_dict(),
        "config": {
            "model": model_cfg or copy_model_config(),
            "data": {"kind": "files", "src_lang": "src", "tgt_lang": "tgt", **data_files},
            "tokenizer": {"model_type": "unigram", "vocab_size": 39, "joint": True},
            "paths": {"data_dir": "data", "cache_dir": "data/cache"},
        },
        "tokenizers": tokenizers_to_payload(copy_tokenizers()),
        "optimizer": {"state": {}, "param_groups": []},
    }


def build_copy_checkpoint(
    directory: Path, *, train_steps: int = 0, name: str = "last.pt", decoder_hidden_size: int = 64,
    attention: str = "additive",
) -> Path:
    """Write ``directory/checkpoints/<name>`` (and the corpus) for a tiny copy-task model.

    With ``train_steps``, the model is first trained on the copy task (300 steps: ~5 s).
    """
    from seq2seq.checkpoint import save_checkpoint
    from seq2seq.models.build import build_model

    data_files = write_copy_corpus(directory)
    model_cfg = copy_model_config(decoder_hidden_size=decoder_hidden_size, attention=attention)
    vocab_size = copy_tokenizers().src.vocab_size
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
    from seq2seq.data.batching import collate
    from seq2seq.data.vocab import PAD_ID

    ids = [np.asarray(x) for x in
           copy_tokenizers().src.encode(sentences(COPY_SPLIT_SIZES["train"], seed=0))]
    rng = random.Random(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    # Linear decay to 0: the annealed model copies ~99% of sentences where a constant rate
    # leaves ~92%, so tests that expect exact copies do not hinge on floating-point noise.
    decay = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=PAD_ID)
    model.train()
    # Matrices this small run fastest on one thread, and the test machine's cores are shared.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(steps):
            picked = [rng.randrange(len(ids)) for _ in range(32)]
            batch = collate([(ids[i], ids[i]) for i in picked], picked)
            features, _ = model(batch.src, batch.src_lengths, batch.tgt_in)
            loss = loss_fn(model.project(features).flatten(0, 1), batch.tgt_out.flatten())
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            decay.step()
    finally:
        torch.set_num_threads(threads)
    model.eval()


@pytest.fixture(scope="session")
def copy_sentences() -> Callable[..., list[str]]:
    """Returns sentences(count, *, seed): copy-task sentences (the trained model copies them)."""
    return sentences


@pytest.fixture(scope="session")
def make_checkpoint() -> Callable[..., Path]:
    """Returns make(directory, *, train_steps=0, name="last.pt", decoder_hidden_size=64,
    attention="additive") -> path of ``directory/checkpoints/<name>``, an untrained (or briefly
    trained) copy-task model with its corpus under ``directory/corpus``."""
    return build_copy_checkpoint


@pytest.fixture(scope="session")
def trained_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``.../copy_model/checkpoints/best.pt``: the copy model, trained once per test session.

    Its corpus lies in ``.../copy_model/corpus``; made once for all test workers
    (:func:`made_once`). Tests must not modify these files (copy them first).
    """
    folder = made_once(tmp_path_factory, "copy_model", lambda path: build_copy_checkpoint(
        path, train_steps=300, name="best.pt"))
    return folder / "checkpoints" / "best.pt"


@pytest.fixture(scope="session")
def exported_copy_model(trained_checkpoint, tmp_path_factory) -> Path:
    """The shared copy-task checkpoint exported by ``export.py``'s own code (in this process:
    an export in a fresh interpreter costs twice as much), once for all test workers
    (:func:`made_once`); ``export.log`` beside it holds what the command logged. Tests must not
    change it."""
    import logging

    from omegaconf import OmegaConf

    from seq2seq import CONFIG_DIR
    from seq2seq.cli.export import run

    def export(folder: Path) -> None:
        cfg = OmegaConf.load(CONFIG_DIR / "export.yaml")
        cfg.pop("defaults")
        cfg.pop("hydra")
        cfg.checkpoint, cfg.output = str(trained_checkpoint), str(folder / "copy")
        records = []
        handler = logging.Handler()
        handler.emit = lambda record: records.append(record.getMessage())
        logger = logging.getLogger("seq2seq.export")
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        try:
            run(cfg)
        finally:
            logger.removeHandler(handler)
        (folder / "export.log").write_text("\n".join(records))

    return made_once(tmp_path_factory, "exported_copy", export) / "copy"


@pytest.fixture(scope="session")
def exported(tmp_path_factory) -> tuple[Path, Path]:
    """(checkpoint, its CTranslate2 folder): a random copy-task Transformer
    (:func:`write_copy_transformer_checkpoint`) and its ``format=ctranslate2`` export, with the
    copy corpus beside them (relative paths, for evaluate.py run there); made once for all test
    workers, to be read, not changed. Skips without ctranslate2."""
    pytest.importorskip("ctranslate2")
    from seq2seq.export import export_checkpoint

    def make(folder: Path) -> None:
        folder.mkdir(parents=True)
        write_copy_transformer_checkpoint(folder)
        export_checkpoint(folder / "transformer.pt", folder / "ct2", format="ctranslate2")

    folder = made_once(tmp_path_factory, "ctranslate2_runtime", make)
    return folder / "transformer.pt", folder / "ct2"


def write_copy_transformer_checkpoint(folder: Path) -> Path:
    """A random copy-task Transformer (untied output layer, PAD and BOS never written, as
    training leaves them) saved as ``folder/transformer.pt`` beside its copy corpus."""
    from seq2seq.checkpoint import save_checkpoint
    from seq2seq.data.vocab import BOS_ID, PAD_ID

    model = random_transformer_model(vocab=39, seed=0, tie_embeddings=False)
    with torch.no_grad():
        model.generator.bias[[PAD_ID, BOS_ID]] = -30.0
    payload = checkpoint_payload(model, write_copy_corpus(folder),
                                 transformer_model_config(tie_embeddings=False))
    save_checkpoint(payload, folder / "transformer.pt")
    return folder / "transformer.pt"


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str,
              make: Callable[[Path], object]) -> Path:
    """``.../name``, made by ``make(path)`` once per test session.

    Under pytest-xdist every worker has its own temporary folder; the first worker to get here
    makes ``name`` in the folder they share (the parent of theirs) under a file lock, and the
    others wait for it and read it. Tests must not modify what it holds (copy it first).
    """
    base = tmp_path_factory.getbasetemp()
    shared = base if os.environ.get("PYTEST_XDIST_WORKER") is None else base.parent
    path = shared / name
    path.parent.mkdir(parents=True, exist_ok=True)
    done = path.parent / f"{path.name}.done"  # written once make has returned
    from filelock import FileLock

    with FileLock(str(path.parent / f"{path.name}.lock")):
        if not done.exists():
            if path.exists():  # left by a make that failed
                shutil.rmtree(path)
            make(path)
            done.touch()
    return path


# -- running the project's scripts --------------------------------------------------------
@pytest.fixture(scope="session")
def preloaded_python(tmp_path_factory: pytest.TempPathFactory) -> PreloadedPython:
    """One forkserver per pytest worker, started on first use (see ``run_python``)."""
    return PreloadedPython(tmp_path_factory.mktemp("python_runs"))


@pytest.fixture
def run_python(preloaded_python: PreloadedPython) -> Iterator[PreloadedPython]:
    """``run_python([script, *args], *, cwd=None, env=None, input="", timeout=None,
    check=False)``: ``subprocess.run([sys.executable, script, *args], capture_output=True,
    text=True)`` in a process forked with torch already imported (``["-m", module, *args]``:
    ``python -m module``); ``run_python.start(...)``: the same, running, like
    ``subprocess.Popen``. tests/python_runner.py says where such a process differs from a
    fresh interpreter; those tests start a real one. A script the test left running is killed
    when it ends."""
    yield preloaded_python
    preloaded_python.stop_all()


@pytest.fixture
def run_tool(run_python: PreloadedPython) -> Callable[..., subprocess.CompletedProcess]:
    """``run_tool([script, *args], *, cwd, stdin="")``: ``run_python`` with one OpenMP thread,
    UTF-8 streams and a 120 s limit, as the CLI tests run the tools."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}

    def run(args: list, *, cwd: Path, stdin: str = "") -> subprocess.CompletedProcess:
        return run_python(args, cwd=cwd, input=stdin, env=env, timeout=120)

    return run


# -- every test ------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def private_precision_cache(tmp_path_factory, monkeypatch):
    """precision=auto's measurements go to a folder of the session's, never the user's cache
    (the scripts the tests run inherit it)."""
    monkeypatch.setenv("SEQ2SEQ_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "user-cache"))


@pytest.fixture(autouse=True)
def one_thread():
    """Run each test on one thread: its models are tiny and the machine's cores are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def api_lines(checkpoint: Path, lines: list[str], *, nbest: int = 1, **options) -> list[str]:
    """translate.py's output lines for ``lines``, made with the Translator API: tests compare
    the command's output with it rather than with strings a trained model happens to give."""
    from dataclasses import fields

    from seq2seq.cli.translate import format_translations
    from seq2seq.inference.decode_options import DecodeOptions
    from seq2seq.inference.runtimes import load_translator

    decoding = {field.name for field in fields(DecodeOptions)}
    request = DecodeOptions(nbest=nbest, **{k: v for k, v in options.items() if k in decoding})
    translator = load_translator(
        checkpoint, **{k: v for k, v in options.items() if k not in decoding})
    return [line for n_best in translator.translate(lines, request, return_attention=False)
            for line in format_translations(n_best, nbest=nbest)]


# -- a real browser (tests/test_serving_browser.py, tests/test_web_export.py) -----------------
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def skip_without_a_browser() -> None:
    """Skip the calling test module, saying why, without Selenium or Debian's chromium and
    chromium-driver (.ci/run installs them)."""
    pytest.importorskip("selenium.webdriver", reason="needs `pip install selenium`")
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("needs a headless browser: apt-get install chromium chromium-driver",
                    allow_module_level=True)


@pytest.fixture
def browser():
    """A fresh headless Chromium, driven by Selenium (call :func:`skip_without_a_browser` at
    the top of a module that uses it)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()
