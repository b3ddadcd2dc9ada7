"""Several training corpora (`data.train` as a list): weights honoured over many batches, on
every rank and across a resumption; a tag as one piece; the single mapping unchanged (cache
key, batches); the training log's shares; one-line errors before anything is written."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import write_lexicon_corpus, write_lines

from seq2seq.checkpoint import load_checkpoint
from seq2seq.data.batching import TokenBucketSampler
from seq2seq.data.cache import FORMAT_VERSION
from seq2seq.data.corpora import check_train_corpora, line_count
from seq2seq.data.hashing import FileHashCache
from seq2seq.data.mixing import CorpusMix
from seq2seq.data.prepare import prepare_from_config
from seq2seq.data.settings import FilterSettings, TokenizerSettings
from seq2seq.data.text_files import DataError, read_lines
from seq2seq.inference.evaluation import split_files
from seq2seq.training.run import train

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = {"model_type": "bpe", "vocab_size": 100, "seed": 1}
WEIGHTS_3_TO_1 = CorpusMix(names=("a", "bt"), sizes=(100, 1000), weights=(3.0, 1.0))


def _lengths(count: int, *, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(1, 30, count), rng.integers(1, 30, count)


def _sampler(mix: CorpusMix, **options) -> TokenBucketSampler:
    src, tgt = _lengths(mix.total, seed=0)
    return TokenBucketSampler(src_lengths=src, tgt_lengths=tgt, max_tokens=300,
                              **{"seed": 1, **options}, mix=mix)


def _shares(mix: CorpusMix, batches: list[list[int]]) -> np.ndarray:
    counts = np.bincount(mix.corpus_of(np.concatenate(batches)), minlength=len(mix))
    return counts / counts.sum()


def _files_config(train, valid: tuple[Path, Path]) -> dict:
    return {"kind": "files", "train": train,
            "valid": {"src": str(valid[0]), "tgt": str(valid[1])},
            "test": {"src": None, "tgt": None}}


def _corpus(files: tuple[Path, Path], **options) -> dict:
    return {"src": str(files[0]), "tgt": str(files[1]), **options}


# -- drawing by weight ----------------------------------------------------------------------
@pytest.mark.parametrize("sizes", [(100, 1000), (1000, 100)])
def test_batches_draw_the_corpora_by_weight_whatever_their_sizes(sizes):
    mix = CorpusMix(names=("a", "bt"), sizes=sizes, weights=(3.0, 1.0))
    sampler = _sampler(mix)
    seen = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert sum(map(len, batches)) == mix.total  # an epoch: as many pairs as all corpora
        assert _shares(mix, batches) == pytest.approx([0.75, 0.25], abs=0.002)
        seen += batches if epoch < 2 else batches[: len(batches) // 2]
    # Over many batches that are not whole epochs: within a few percent. (Half an epoch alone
    # can be ~6 % off here: the copies of an oversampled pair, being of one length, tend to
    # share a batch when a bucket window holds the whole epoch.)
    assert _shares(mix, seen) == pytest.approx([0.75, 0.25], abs=0.02)


def test_a_corpus_drawn_less_than_its_size_shows_every_pair_before_any_repeats():
    mix = WEIGHTS_3_TO_1
    assert mix.quotas().tolist() == [825, 275]
    draws = [mix.epoch_indices(seed=7, epoch=epoch) for epoch in range(3)]
    large = np.concatenate([drawn[drawn >= 100] for drawn in draws])
    assert len(large) == len(np.unique(large)) == 825  # three epochs, no pair twice
    small = draws[0][draws[0] < 100]
    assert set(np.bincount(small, minlength=100).tolist()) == {8, 9}  # 825 of 100 pairs
    # The same epoch drawn again (another rank, a resumed run) is the same draw.
    assert np.array_equal(mix.epoch_indices(seed=7, epoch=2), draws[2])


def test_ranks_deal_the_weighted_draw_between_them():
    whole = list(_sampler(WEIGHTS_3_TO_1))
    ranks = [list(_sampler(WEIGHTS_3_TO_1, rank=rank, world_size=2)) for rank in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == len(whole) // 2
    assert [batch for pair in zip(*ranks, strict=True) for batch in pair] == whole[: 2 * len(ranks[0])]
    assert _shares(WEIGHTS_3_TO_1, ranks[0] + ranks[1]) == pytest.approx([0.75, 0.25], abs=0.02)


def test_resumed_mid_epoch_the_batches_are_those_of_an_uninterrupted_epoch():
    uninterrupted = _sampler(WEIGHTS_3_TO_1, seed=3)
    uninterrupted.set_epoch(1)
    expected = list(uninterrupted)
    interrupted = _sampler(WEIGHTS_3_TO_1, seed=3)
    interrupted.set_epoch(1)
    batches = iter(interrupted)
    head = [next(batches) for _ in range(10)]
    resumed = _sampler(WEIGHTS_3_TO_1, seed=3)
    resumed.load_state_dict(interrupted.state_dict())
    assert head + list(resumed) == expected


# -- the data stage -------------------------------------------------------------------------
def _prepare(data: dict, cache_dir: Path):
    return prepare_from_config({"data": data, "tokenizer": TOKENIZER,
                                "paths": {"cache_dir": str(cache_dir)}})


def test_the_single_mapping_keeps_its_cache_key_and_batches(write_parallel, toy_pairs, tmp_path):
    train_files = write_parallel("train", toy_pairs(1, 200))
    valid = write_parallel("valid", toy_pairs(2, 20))
    mapping = _prepare(_files_config(_corpus(train_files), valid), tmp_path / "cache")
    # The key as it was computed before data.train took a list: existing caches stay valid.
    material = {
        "format_version": FORMAT_VERSION,
        "files": {split: [hashlib.sha256(Path(path).read_bytes()).hexdigest() for path in pair]
                  for split, pair in (("train", train_files), ("valid", valid))},
        "tokenizer": dataclasses.asdict(TokenizerSettings.from_config(TOKENIZER)),
        "filter": dataclasses.asdict(FilterSettings()),
    }
    expected_key = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:24]
    assert mapping.cache_dir.name == expected_key
    assert mapping.train_mix is None and "corpora" not in mapping.summary
    # A list of that one corpus, untagged, is the same data: the same cache.
    listed = _prepare(_files_config([_corpus(train_files, weight=5)], valid), tmp_path / "cache")
    assert listed.cache_hit and listed.cache_dir == mapping.cache_dir
    assert listed.train_mix is None
    # No mix (or a mix of one corpus) is the sampler's own shuffle: the batches of before.
    data = mapping.splits["train"]
    one = CorpusMix(names=("train",), sizes=(len(data),), weights=(1.0,))
    plain, single = (TokenBucketSampler(src_lengths=data.src_lengths, tgt_lengths=data.tgt_lengths,
                                        max_tokens=200, seed=4, mix=mix) for mix in (None, one))
    assert list(plain) == list(single)


def test_a_tag_is_one_piece_at_the_start_of_its_corpus_sources(write_parallel, toy_pairs,
                                                                tmp_path):
    a = write_parallel("a", toy_pairs(1, 100))
    bt = write_parallel("bt", toy_pairs(3, 300))
    valid = write_parallel("valid", toy_pairs(2, 20))
    corpora = [_corpus(a, weight=3), _corpus(bt, tag="<bt>")]
    prepared = _prepare(_files_config(corpora, valid), tmp_path / "cache")
    source = prepared.tokenizers.src
    [tag] = source.encode(["<bt>"])[0]
    assert source.id_to_piece(tag) == "<bt>" and source.user_symbols == ("<bt>",)
    data = prepared.splits["train"]
    sources = [data[index][0].tolist() for index in range(len(data))]
    assert len(sources) == 400  # a's pairs, then bt's
    assert all(tag not in ids for ids in sources[:100])
    assert all(ids[0] == tag and tag not in ids[1:] for ids in sources[100:])
    first_line = read_lines(bt[0])[0]
    assert sources[100] == [tag, *source.encode([first_line])[0]]
    # A line to translate that starts with the tag gets the same one piece (sentencepiece
    # alone would put a lone "▁" before it).
    assert source.encode([f"<bt> {first_line}"]) == [sources[100]]
    assert tag not in prepared.tokenizers.tgt.kept_ids  # no output row for it
    assert [(corpus["name"], corpus["tag"], corpus["pairs_kept"])
            for corpus in prepared.summary["corpora"]] == [("a", None, 100), ("bt", "<bt>", 300)]
    assert prepared.train_mix == CorpusMix(names=("a", "bt"), sizes=(100, 300),
                                           weights=(3.0, 1.0))


def test_a_new_weight_reuses_the_cache_and_a_new_tag_does_not(write_parallel, toy_pairs,
                                                              tmp_path):
    a = write_parallel("a", toy_pairs(1, 100))
    bt = write_parallel("bt", toy_pairs(3, 300))
    valid = write_parallel("valid", toy_pairs(2, 20))

    def prepare(weight: float, tag: str):
        return _prepare(_files_config([_corpus(a, weight=weight), _corpus(bt, tag=tag)], valid),
                        tmp_path / "cache")

    first = prepare(3, "<bt>")
    assert "corpus bt: 300 of 300 pairs kept, tag <bt>, weight 1 (25.0 % of the pairs drawn)" \
        in first.format_summary()
    reweighted = prepare(1, "<bt>")
    assert reweighted.cache_hit and reweighted.cache_dir == first.cache_dir
    assert reweighted.train_mix.weights == (1.0, 1.0)
    assert reweighted.summary["corpora"][0]["share"] == 0.5
    retagged = prepare(3, "<back>")
    assert not retagged.cache_hit and retagged.cache_dir != first.cache_dir


def test_evaluation_reads_the_splits_of_either_form(write_parallel, toy_pairs, tmp_path):
    """evaluate.py reads a checkpoint's data config: an old single mapping, or a list (whose
    training files need not exist any more)."""
    train_files = write_parallel("train", toy_pairs(1, 30))
    valid = write_parallel("valid", toy_pairs(2, 20))
    gone = (tmp_path / "gone.de", tmp_path / "gone.en")
    for data in (_files_config(_corpus(train_files), valid),
                 _files_config([_corpus(train_files), _corpus(gone, tag="<bt>")], valid)):
        assert split_files({"data": data}, "valid") == valid


def test_line_counts_match_the_readers_and_are_remembered(tmp_path, monkeypatch):
    plain = tmp_path / "a.txt"
    plain.write_bytes(b"x\ny\n\nz")  # the last line has no line break
    packed = write_lines(tmp_path / "b.gz", ["p", "", "q"])
    assert line_count(plain) == len(read_lines(plain)) == 4
    assert line_count(packed) == len(read_lines(packed)) == 3
    memo = FileHashCache(path=tmp_path / "hashes.json")
    assert line_count(plain, memo=memo) == 4
    memo.save()
    monkeypatch.setattr("seq2seq.data.corpora.open_binary",
                        lambda path: pytest.fail(f"{path} read again"))
    assert line_count(plain, memo=FileHashCache(path=tmp_path / "hashes.json")) == 4


# -- errors ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("train", "message"), [
    ([], "data.train is an empty list: give at least one {src, tgt} corpus"),
    ([{"src": "A", "tgt": "B", "weight": 0}],
     "data.train[0].weight must be a positive number, got 0"),
    ([{"src": "A", "tgt": "B"}, {"src": "A", "tgt": "B", "weight": -2}],
     "data.train[1].weight must be a positive number, got -2"),
    ([{"src": "A", "tgt": "B", "weight": "many"}], "got 'many'"),
    ([{"src": "A", "tgt": "B", "tag": "<b t>"}], "data.train[0].tag must be one token-like string"),
    ([{"src": "A", "tgt": "B", "tag": ""}], "data.train[0].tag must be one token-like string"),
    ([{"src": "A", "tgt": "B", "tag": "</s>"}], "data.train[0].tag must be one token-like string"),
    ([{"src": "A", "tgt": "B", "tag": 5}], "data.train[0].tag must be one token-like string"),
    ([{"src": "A", "tgt": "B", "wieght": 2}],
     "data.train[0] has unknown key(s) wieght: a corpus takes src, tgt, weight, tag, name"),
    (["A"], "data.train[0] must be a mapping with src and tgt"),
    ([{"src": "A"}], "data.train[0].tgt is not set"),
    ([{"src": "A", "tgt": "MISSING"}], "missing.en (data.train[0].tgt)"),
    ({"src": "MISSING", "tgt": "B"}, "missing.en (data.train.src)"),
    ([{"src": "A", "tgt": "B"}, {"src": "A", "tgt": "SHORT"}],
     "source and target have different line counts"),
    ([{"src": "A", "tgt": "B", "name": "x"}, {"src": "A", "tgt": "B", "name": "x"}],
     "data.train: corpus name 'x' is used twice"),
])
def test_bad_corpora_are_one_line_errors(write_parallel, toy_pairs, tmp_path, train, message):
    a = write_parallel("a", toy_pairs(1, 30))
    short = write_parallel("short", toy_pairs(2, 29))
    paths = {"A": str(a[0]), "B": str(a[1]), "SHORT": str(short[1]),
             "MISSING": str(tmp_path / "missing.en")}

    def resolved(entry):
        if not isinstance(entry, dict):
            return paths.get(entry, entry)
        return {key: paths.get(value, value) if isinstance(value, str) else value
                for key, value in entry.items()}

    train = [resolved(entry) for entry in train] if isinstance(train, list) else resolved(train)
    with pytest.raises(DataError) as raised:
        check_train_corpora(_files_config(train, a), cache_dir=None)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_bad_corpora_stop_train_py_before_the_run_folder(tmp_path, run_python):
    corpus = write_lexicon_corpus(tmp_path, "a", 30, seed=1)
    result = run_python([ROOT / "train.py", "data=corpora", "data.train=[]",
                         f"data.valid.src={corpus[0]}", f"data.valid.tgt={corpus[1]}"],
                        cwd=tmp_path, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: data.train is an empty list: give at least one {src, tgt} corpus"]
    assert not (tmp_path / "outputs").exists()  # no run folder claimed
    assert not (tmp_path / "data").exists()  # nor any data prepared


# -- training -------------------------------------------------------------------------------
def test_the_training_log_gives_each_corpus_share_and_a_resumed_run_goes_on_counting(
        tiny_train_config, tmp_path, caplog):
    small = write_lexicon_corpus(tmp_path, "small", 60, seed=5)
    large = tiny_train_config.corpus["train"]  # 600 pairs, named "train" after its file
    corpora = (f"[{{src: {small[0]}, tgt: {small[1]}, weight: 3}}, "
               f"{{src: {large[0]}, tgt: {large[1]}, tag: '<bt>'}}]")

    def run(folder: str, steps: int, **extra) -> dict:
        cfg = tiny_train_config(**{"data": "corpora", "data.train.src": None,
                                   "data.train.tgt": None, "data.train": corpora,
                                   "trainer.max_steps": steps, "trainer.log_every": 10,
                                   "trainer.valid_every": 20, "trainer.save_every": 10, **extra})
        train(cfg, tmp_path / folder)
        return load_checkpoint(tmp_path / folder / "checkpoints" / "last.pt")

    with caplog.at_level(logging.INFO, logger="seq2seq.training.trainer"):
        uninterrupted = run("whole", 20)
    lines = [record.getMessage() for record in caplog.records
             if "corpora:" in record.getMessage()]
    assert len(lines) == 2  # steps 10 and 20
    shares = dict(re.findall(r"(\w+) ([\d.]+) %", lines[-1].split("corpora:")[1]))
    assert float(shares["small"]) == pytest.approx(75, abs=5)
    assert float(shares["train"]) == pytest.approx(25, abs=5)
    seen = uninterrupted["corpus_pairs_seen"]
    assert len(seen) == 2 and sum(seen) > 0

    run("parts", 10)
    resumed = run("parts", 20, **{"trainer.resume": "auto"})
    assert resumed["corpus_pairs_seen"] == seen
