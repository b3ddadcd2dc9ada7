"""Fine-tuning (trainer.init_from): the child starts as its parent, records it, refuses model
settings that contradict it, freezes parts, extends the vocabulary, reports what it lacks."""

from __future__ import annotations

import hashlib
import logging
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import LEXICON_WORDS, TinyTrainConfig, made_once, write_lexicon_corpus
from omegaconf import OmegaConf

from seq2seq.checkpoint import load_checkpoint, tokenizers_from_payload
from seq2seq.config_types import ConfigError
from seq2seq.data.tokenizer import SentencePieceTokenizer, SubsetTokenizer, Tokenizers
from seq2seq.data.vocab import UNK_ID
from seq2seq.data.vocabulary_coverage import extend_tokenizers, measure_coverage
from seq2seq.inference.decode_options import DecodeOptions
from seq2seq.inference.runtimes import load_translator
from seq2seq.training.run import check_train_config, train
from seq2seq.training.settings import TrainerSettings

ROOT = Path(__file__).resolve().parents[1]


def train_parent(folder: Path) -> None:
    """The tiny train config's model, trained 60 steps on the word-for-word language."""
    (folder / "corpus").mkdir(parents=True)
    corpus = {"train": write_lexicon_corpus(folder / "corpus", "train", 600, seed=1),
              "valid": write_lexicon_corpus(folder / "corpus", "valid", 40, seed=2)}
    tiny = TinyTrainConfig(corpus, folder / "data")
    train(tiny(), folder / "run", overrides=tiny.overrides())


@pytest.fixture(scope="session")
def parent_run(tmp_path_factory) -> Path:
    """A trained parent's run folder, made once per session (read it, never write)."""
    return made_once(tmp_path_factory, "finetune_parent", train_parent) / "run"


def child_config(parent_run: Path, corpus: dict, data_dir: Path, **extra):
    """The tiny config over ``corpus``, started from ``parent_run``: (config, overrides)."""
    tiny = TinyTrainConfig(corpus, data_dir)
    extra = {"trainer.init_from": parent_run, **extra}
    return tiny(**extra), tiny.overrides(**extra)


def train_child(parent_run: Path, corpus: dict, folder: Path, **extra) -> dict:
    """Train a child into ``folder / "run"``; returns its last checkpoint."""
    config, overrides = child_config(parent_run, corpus, folder / "data", **extra)
    train(config, folder / "run", overrides=overrides)
    return load_checkpoint(folder / "run" / "checkpoints" / "last.pt")


def new_corpus(folder: Path, *, words=LEXICON_WORDS, seed: int = 7) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    return {"train": write_lexicon_corpus(folder, "new", 300, seed=seed, words=words),
            "valid": write_lexicon_corpus(folder, "new_valid", 20, seed=seed + 1, words=words)}


def translations(checkpoint: Path, sentences: list[str], beam_size: int) -> list[list[str]]:
    translator = load_translator(checkpoint)
    return [best[0].target_pieces for best in translator.translate(
        sentences, DecodeOptions(beam_size=beam_size), return_attention=False)]


def old_sentences(parent_run: Path) -> list[str]:
    """Sentences the parent can write: its own validation sources."""
    config = OmegaConf.load(parent_run / "config.yaml")
    return Path(config.data.valid.src).read_text("utf-8").splitlines()


@pytest.fixture(scope="module")
def child_run(parent_run, tmp_path_factory) -> Path:
    """A child of ``parent_run`` on new pairs of the same language, before its first step."""
    folder = tmp_path_factory.mktemp("child")
    train_child(parent_run, new_corpus(folder / "corpus"), folder, **{"trainer.max_steps": 0})
    return folder / "run"


# -- the child before its first step ---------------------------------------------------------
def test_child_equals_its_parent_before_its_first_step(parent_run, child_run):
    parent = load_checkpoint(parent_run / "checkpoints" / "best.pt")
    child = load_checkpoint(child_run / "checkpoints" / "last.pt")
    assert child["trainer_state"]["step"] == 0
    assert child["model"].keys() == parent["model"].keys()
    for name, tensor in parent["model"].items():
        assert torch.equal(child["model"][name], tensor), name
    assert child["config"]["model"] == parent["config"]["model"]
    assert child["tokenizers"]["src"].equal(parent["tokenizers"]["src"])
    assert child["tokenizers"]["tgt_kept_ids"].equal(parent["tokenizers"]["tgt_kept_ids"])
    sentences = old_sentences(parent_run)
    for beam_size in (1, 4):
        assert (translations(child_run / "checkpoints" / "last.pt", sentences, beam_size)
                == translations(parent_run / "checkpoints" / "best.pt", sentences, beam_size))


def test_the_child_records_its_parent_with_its_sha256(parent_run, child_run):
    parent_file = parent_run / "checkpoints" / "best.pt"
    expected = {"checkpoint": str(parent_file.resolve()),
                "sha256": hashlib.sha256(parent_file.read_bytes()).hexdigest()}
    assert OmegaConf.to_container(OmegaConf.load(child_run / "config.yaml"))["parent"] == expected
    for name in ("last.pt", "best.pt"):
        assert load_checkpoint(child_run / "checkpoints" / name)["config"]["parent"] == expected
    # A run from scratch records none, and its checkpoints load as before.
    assert "parent" not in load_checkpoint(parent_file)["config"]


def test_the_log_reports_the_parent_and_its_coverage(parent_run, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    train_child(parent_run, new_corpus(tmp_path / "corpus"), tmp_path, **{"trainer.max_steps": 0})
    messages = [record.getMessage() for record in caplog.records]
    assert any(message.startswith(f"fine-tuning from {parent_run.resolve()}/checkpoints/best.pt")
               for message in messages)
    assert ("parent vocabulary: 0.0 % of source and 0.0 % of target sentences have pieces it "
            "lacks (unknown)") in messages


# -- what the child may not change -----------------------------------------------------------
@pytest.mark.parametrize(("override", "message"), [
    ({"model.decoder.hidden_size": 48},
     "model.decoder.hidden_size=48 contradicts the parent's model: model.decoder.hidden_size "
     "is 48 here and 64 in "),
    ({"model/encoder": "lstm"},
     "model/encoder=lstm contradicts the parent's model: model.encoder.rnn_type is 'lstm' "
     "here and 'gru' in "),
])
def test_a_model_setting_that_contradicts_the_parent_is_refused(parent_run, tmp_path, override,
                                                                 message):
    config, overrides = child_config(parent_run, new_corpus(tmp_path / "corpus"),
                                     tmp_path / "data", **override)
    with pytest.raises(ConfigError) as raised:
        check_train_config(OmegaConf.to_container(config, resolve=True), overrides)
    assert str(raised.value).startswith(message)
    assert "leave the override out" in str(raised.value)


def test_model_settings_that_agree_with_the_parent_are_accepted(parent_run, tmp_path):
    config, overrides = child_config(parent_run, new_corpus(tmp_path / "corpus"),
                                     tmp_path / "data", **{"model.decoder.hidden_size": 64})
    check_train_config(OmegaConf.to_container(config, resolve=True), overrides)


def test_train_py_refuses_a_contradiction_in_one_line_before_the_run_folder(parent_run,
                                                                            tmp_path, run_python):
    _, overrides = child_config(parent_run, new_corpus(tmp_path / "corpus"), tmp_path / "data",
                                **{"model.decoder.hidden_size": 48})
    result = run_python([ROOT / "train.py", *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
                        cwd=tmp_path, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1, result.stdout + result.stderr
    assert len(lines) == 1 and lines[0].startswith(
        "error: model.decoder.hidden_size=48 contradicts the parent's model"), lines
    assert not (tmp_path / "run").exists() and not (tmp_path / "data").exists()


@pytest.mark.parametrize(("trainer", "message"), [
    ({"freeze": ["encoder", "attention"]},
     "trainer.freeze: unknown part 'attention'; the parts are encoder, decoder, embeddings"),
    ({"freeze": ["encoder"]}, "trainer.freeze applies to fine-tuning only"),
    ({"extend_vocab": True}, "trainer.extend_vocab applies to fine-tuning only"),
    ({"init_from": "runs/a", "resume": "runs/b/checkpoints/last.pt"},
     "trainer.init_from starts a new run from a parent's weights and trainer.resume="),
    ({"init_from": "runs/a", "extend_vocab": True, "freeze": ["decoder"]},
     "trainer.freeze=[decoder] with trainer.extend_vocab=true"),
    ({"init_from": "runs/a", "extend_vocab": "yes"},
     "trainer.extend_vocab must be auto, true or false, got 'yes'"),
])
def test_fine_tuning_options_that_cannot_work_are_one_line(trainer, message):
    with pytest.raises(ConfigError) as raised:
        TrainerSettings.from_dict(trainer)
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)


def test_a_missing_parent_is_one_line(tmp_path, tiny_train_config):
    config = tiny_train_config(**{"trainer.init_from": tmp_path / "nothing"})
    with pytest.raises(ConfigError, match=r"^trainer.init_from=.*nothing: no checkpoint at "):
        check_train_config(OmegaConf.to_container(config, resolve=True), [])


def test_an_interrupted_child_continues_with_the_same_command(parent_run, tmp_path):
    corpus = new_corpus(tmp_path / "corpus")
    options = {"trainer.save_every": 1, "trainer.valid_every": 1000, "trainer.resume": "auto"}
    assert train_child(parent_run, corpus, tmp_path, **options,
                       **{"trainer.max_steps": 2})["trainer_state"]["step"] == 2
    assert train_child(parent_run, corpus, tmp_path, **options,
                       **{"trainer.max_steps": 4})["trainer_state"]["step"] == 4


# -- freezing --------------------------------------------------------------------------------
FROZEN = {
    "encoder": lambda name: name.startswith("encoder."),
    "decoder": lambda name: name.startswith(("decoder.", "generator.")),
    "embeddings": lambda name: name.endswith("embedding.weight"),
}


@pytest.mark.parametrize("part", sorted(FROZEN))
def test_frozen_parameters_stay_as_the_parent_left_them_and_the_others_train(
        parent_run, tmp_path, part, caplog):
    caplog.set_level(logging.INFO)
    parent = load_checkpoint(parent_run / "checkpoints" / "best.pt")["model"]
    child = train_child(parent_run, new_corpus(tmp_path / "corpus"), tmp_path, **{
        "trainer.freeze": f"[{part}]", "trainer.max_steps": 3, "trainer.valid_every": 1000})
    frozen = {name for name in parent if FROZEN[part](name)}
    assert frozen
    for name, tensor in parent.items():
        assert torch.equal(child["model"][name], tensor) == (name in frozen), name
    total = sum(tensor.numel() for tensor in parent.values())
    training = total - sum(parent[name].numel() for name in frozen)
    assert (f"trainer.freeze=[{part}]: {training:,} of {total:,} parameters train"
            in [record.getMessage() for record in caplog.records])


# -- the vocabulary: coverage and extension --------------------------------------------------
def write_pairs(folder: Path, name: str, pairs: list[tuple[str, str]]) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / f"{name}.src", folder / f"{name}.tgt"
    for path, side in zip(paths, zip(*pairs, strict=True), strict=True):
        path.write_text("".join(f"{line}\n" for line in side), "utf-8")
    return paths


@pytest.fixture(scope="module")
def joint_tokenizers() -> Tokenizers:
    """A joint BPE model over lower-case sources and upper-case targets, its target side
    pruned to the pieces of the targets."""
    rng = random.Random(3)
    sources = [" ".join(rng.choice(LEXICON_WORDS) for _ in range(5)) for _ in range(200)]
    targets = [sentence.upper() for sentence in sources]
    base = SentencePieceTokenizer.train(sources + targets, vocab_size=60, max_sentences=0)
    kept = sorted({piece for ids in base.encode(targets) for piece in ids})
    return Tokenizers(src=base, tgt=SubsetTokenizer(base=base, kept_ids=kept), joint=True)


def test_coverage_counts_the_sentences_with_pieces_the_vocabulary_lacks(joint_tokenizers,
                                                                        tmp_path):
    pairs = [("ka lo", "KA LO")] * 6 + [("ka ßlo", "KA LO")] * 3 + [("mi", "MI É")] \
        + [("mi ka", "ka MI")] * 2 + [("ßß", "")]  # an empty side: never trained on, not counted
    coverage = measure_coverage(joint_tokenizers, [write_pairs(tmp_path, "new", pairs)])
    assert (coverage.src.sentences, coverage.src.unknown_sentences) == (12, 3)
    assert (coverage.tgt.sentences, coverage.tgt.unknown_sentences) == (12, 3)
    assert coverage.src.missing_characters == {"ß": 3}
    assert coverage.tgt.missing_characters == {"É": 1}
    # "ka" on the target side: pieces of the joint model outside the kept target subset.
    base, kept = joint_tokenizers.src, set(joint_tokenizers.tgt.kept_ids.tolist())
    assert coverage.unkept_target_ids == sorted(set(base.encode(["ka MI"])[0]) - kept)
    assert coverage.unkept_target_ids
    assert coverage.format() == ("parent vocabulary: 25.0 % of source and 25.0 % of target "
                                 "sentences have pieces it lacks (unknown)")


def test_extension_appends_pieces_and_keeps_every_old_id(joint_tokenizers, tmp_path):
    pairs = [("ka ßlo", "KA LO")] * 3 + [("mi", "MI É")] + [("mi ka", "ka MI")]
    parent = joint_tokenizers
    child = extend_tokenizers(parent, measure_coverage(parent, [write_pairs(tmp_path, "n", pairs)]))
    assert child.src.vocab_size == parent.src.vocab_size + 2  # ß and É
    kept = parent.tgt.kept_ids
    assert np.array_equal(child.tgt.kept_ids[:len(kept)], kept)
    assert child.tgt.vocab_size == len(kept) + len(set(parent.src.encode(["ka"])[0])
                                                    - set(kept.tolist())) + 1  # and É
    old = ["ka lo mi nu", "bar den ve"]
    assert child.src.encode(old) == parent.src.encode(old)
    assert child.tgt.encode([s.upper() for s in old]) == parent.tgt.encode([s.upper() for s in old])
    for tokenizer, side in ((child.src, 0), (child.tgt, 1)):
        assert all(UNK_ID not in ids for ids in tokenizer.encode([pair[side] for pair in pairs]))
    # A pruned subset keeps the order it is given: the parent's ids, then the added ones.
    subset = SubsetTokenizer(base=parent.src, kept_ids=[10, 5, 10, 2])
    assert subset.kept_ids.tolist() == [0, 1, 2, 3, 10, 5]


def extension_corpus(folder: Path) -> dict:
    """New pairs with words of new characters (q, f, y: Q, F, Y on the target side) and, on
    some targets, a lower-case word (pieces outside the parent's pruned target subset)."""
    folder.mkdir(parents=True)
    src, tgt = write_lexicon_corpus(folder, "new", 300, seed=5,
                                    words=[*LEXICON_WORDS, "qo", "fy"])
    targets = tgt.read_text("utf-8").splitlines()
    tgt.write_text("".join(f"{line} ka\n" if i % 10 == 0 else f"{line}\n"
                           for i, line in enumerate(targets)), "utf-8")
    return {"train": (src, tgt),
            "valid": write_lexicon_corpus(folder, "new_valid", 20, seed=6)}


def test_extension_keeps_the_old_rows_and_translates_old_text_as_the_parent(
        parent_run, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    parent_file = parent_run / "checkpoints" / "best.pt"
    parent = load_checkpoint(parent_file)
    child = train_child(parent_run, extension_corpus(tmp_path / "corpus"), tmp_path,
                        **{"trainer.extend_vocab": True, "trainer.max_steps": 0})
    kept, child_kept = parent["tokenizers"]["tgt_kept_ids"], child["tokenizers"]["tgt_kept_ids"]
    assert child_kept[:len(kept)].equal(kept)
    # The joint model gains q f y Q F Y; the target side Q F Y and the pieces of "ka".
    assert len(child_kept) > len(kept) + 3
    rows = {"encoder.embedding.weight": parent["model"]["encoder.embedding.weight"].shape[0] + 6,
            "decoder.embedding.weight": len(child_kept), "generator.weight": len(child_kept),
            "generator.bias": len(child_kept)}
    for name, tensor in parent["model"].items():
        mine = child["model"][name]
        if name in rows:
            assert mine.shape[0] == rows[name], name
            assert torch.equal(mine[:tensor.shape[0]], tensor), name
        else:
            assert torch.equal(mine, tensor), name
    # New rows start as the mean of the old pieces' rows; a new output bias below the lowest.
    old_rows = parent["model"]["encoder.embedding.weight"][4:]
    torch.testing.assert_close(child["model"]["encoder.embedding.weight"][-1], old_rows.mean(0))
    old_bias = parent["model"]["generator.bias"]
    assert torch.equal(child["model"]["generator.bias"][len(kept):],
                       (old_bias[4:].min() - 10).expand(len(child_kept) - len(kept)))
    assert any(re.fullmatch(r"trainer.extend_vocab: 6 source and \d+ target pieces added "
                            r"\(characters: F Q Y f q y\); \d+ pieces of the joint vocabulary "
                            r"newly kept on the target side", record.getMessage())
               for record in caplog.records)
    sentences = old_sentences(parent_run)
    for beam_size in (1, 4):
        assert (translations(tmp_path / "run" / "checkpoints" / "last.pt", sentences, beam_size)
                == translations(parent_file, sentences, beam_size))


def test_several_corpora_are_all_measured_and_extended(parent_run, tmp_path, caplog):
    """data=corpora: the report and the extension cover every corpus, the second one's new
    characters included."""
    caplog.set_level(logging.INFO)
    corpus = new_corpus(tmp_path / "corpus")
    second = write_lexicon_corpus(tmp_path / "corpus", "second", 100, seed=9, words=["qo"])
    tiny = TinyTrainConfig(corpus, tmp_path / "data")
    extra = {"data": "corpora", "data.train.src": None, "data.train.tgt": None,
             "data.train": f"[{{src: {corpus['train'][0]}, tgt: {corpus['train'][1]}}}, "
                           f"{{src: {second[0]}, tgt: {second[1]}, weight: 2}}]",
             "trainer.init_from": parent_run, "trainer.extend_vocab": True,
             "trainer.max_steps": 2, "trainer.valid_every": 1000}
    train(tiny(**extra), tmp_path / "run", overrides=tiny.overrides(**extra))
    messages = [record.getMessage() for record in caplog.records]
    assert ("parent vocabulary: 25.0 % of source and 25.0 % of target sentences have pieces it "
            "lacks (unknown)") in messages  # 100 of 400 sentences hold q (Q)
    assert any(message.startswith("trainer.extend_vocab: 2 source and 1 target pieces added "
                                  "(characters: Q q)") for message in messages)


# -- trainer.extend_vocab=auto (the default) and the warning without it -----------------------
UNKNOWN_WORDS_WARNING = (
    "parent vocabulary: 100.0 % of source and 100.0 % of target sentences have pieces it lacks "
    "(unknown): the model reads <unk> for the source words they spell and writes <unk> in place "
    "of the target words they spell; ")


def warnings_of(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.levelno == logging.WARNING and record.name == "seq2seq.training.finetune"]


def same_vocabulary(first: dict, second: dict) -> bool:
    return all(first["tokenizers"][key].equal(second["tokenizers"][key])
               for key in ("src", "tgt_kept_ids"))


@pytest.fixture
def unknown_words(tmp_path) -> dict:
    """New pairs each of which holds words of characters the parent never saw (q f y, and
    Q F Y on the target side)."""
    return new_corpus(tmp_path / "corpus", words=["qo", "fy"])


def test_without_extension_a_warning_gives_the_share_and_the_unk(parent_run, tmp_path,
                                                                 unknown_words, caplog):
    """trainer.extend_vocab=false keeps the parent's vocabulary and weights, as before auto."""
    caplog.set_level(logging.INFO)
    child = train_child(parent_run, unknown_words, tmp_path,
                        **{"trainer.extend_vocab": False, "trainer.max_steps": 0})
    assert warnings_of(caplog) == [
        UNKNOWN_WORDS_WARNING + "trainer.extend_vocab=auto or true adds them"]
    parent = load_checkpoint(parent_run / "checkpoints" / "best.pt")
    assert same_vocabulary(child, parent)
    assert all(torch.equal(child["model"][name], tensor)
               for name, tensor in parent["model"].items())


def test_auto_extends_where_the_new_data_needs_it(parent_run, tmp_path, unknown_words, caplog):
    caplog.set_level(logging.INFO)
    child = train_child(parent_run, unknown_words, tmp_path, **{"trainer.max_steps": 0})
    assert warnings_of(caplog) == []
    tokenizers = tokenizers_from_payload(child["tokenizers"])
    sources, targets = (path.read_text("utf-8").splitlines() for path in unknown_words["train"])
    assert all(UNK_ID not in ids for ids in tokenizers.src.encode(sources))
    assert all(UNK_ID not in ids for ids in tokenizers.tgt.encode(targets))
    assert any(re.fullmatch(r"trainer.extend_vocab: 6 source and \d+ target pieces added "
                            r"\(characters: F Q Y f q y\)", record.getMessage())
               for record in caplog.records)


def test_auto_changes_nothing_where_nothing_is_missing(parent_run, tmp_path):
    corpus = new_corpus(tmp_path / "corpus")
    options = {"trainer.max_steps": 2, "trainer.valid_every": 1000}
    auto = train_child(parent_run, corpus, tmp_path / "auto", **options)
    never = train_child(parent_run, corpus, tmp_path / "never",
                        **options, **{"trainer.extend_vocab": False})
    assert same_vocabulary(auto, never)
    assert same_vocabulary(auto, load_checkpoint(parent_run / "checkpoints" / "best.pt"))
    assert auto["model"].keys() == never["model"].keys()
    for name, tensor in never["model"].items():
        assert torch.equal(auto["model"][name], tensor), name


def test_auto_does_not_extend_a_child_with_frozen_parts_and_says_why(parent_run, tmp_path,
                                                                    unknown_words, caplog):
    caplog.set_level(logging.INFO)
    child = train_child(parent_run, unknown_words, tmp_path,
                        **{"trainer.freeze": "[encoder]", "trainer.max_steps": 0})
    assert warnings_of(caplog) == [
        UNKNOWN_WORDS_WARNING + "trainer.extend_vocab=auto adds none while "
        "trainer.freeze=[encoder] is set (their rows could not train): unfreeze to add them"]
    assert same_vocabulary(child, load_checkpoint(parent_run / "checkpoints" / "best.pt"))
