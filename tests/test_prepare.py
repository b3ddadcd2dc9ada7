"""prepare_data: filtering, unfiltered valid/test, caching, errors, config resolution, CLI."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from seq2seq.data.encode import fillers_to_a_multiple
from seq2seq.data.prepare import prepare_data, prepare_from_config
from seq2seq.data.settings import FilterSettings, TokenizerSettings
from seq2seq.data.sources import corpus_files_from_config
from seq2seq.data.text_files import DataError, read_lines

REPOSITORY = Path(__file__).resolve().parents[1]
SMALL_TOKENIZER = TokenizerSettings(model_type="bpe", vocab_size=100, joint=True, seed=1)
FILTER = FilterSettings(max_length=80, max_length_ratio=3.0)


def _prepare(
    files: dict,
    cache_dir: Path,
    *,
    tokenizer: TokenizerSettings = SMALL_TOKENIZER,
    filter: FilterSettings = FILTER,
):
    return prepare_data(files=files, tokenizer=tokenizer, filter=filter, cache_dir=cache_dir)


def _side(dataset, side: int) -> list[list[int]]:
    """One side of an encoded split, sentence by sentence."""
    return [dataset[i][side].tolist() for i in range(len(dataset))]


def _cache_entries(cache_dir: Path) -> list[str]:
    """Cache directories (complete or temporary), ignoring the file-hash memo."""
    return sorted(path.name for path in cache_dir.iterdir() if path.is_dir())


def test_training_pairs_are_filtered_and_counted(write_parallel, toy_pairs, tmp_path: Path) -> None:
    rng = random.Random(5)
    clean = toy_pairs(11, 300)
    # Every word is at least one piece and a toy word at most 3 syllables (at most ~4 pieces):
    # 100+ words exceed max_length=80 whatever the segmentation, clean pairs (<= 12 words) do
    # not, and one or two short words against 20+ are beyond the ratio of 3.
    empty = [("", "ka lo"), ("mi nu", ""), ("   ", "pe ra")]
    too_long = [(" ".join(["kalo"] * 100), "kalo"), ("mi", " ".join(["nu"] * 120))]
    skewed = [("ka", " ".join(["ka"] * 30)), (" ".join(["lo"] * 30), "lo"), ("mi", "mi " * 20)]
    noisy = clean + empty + too_long + skewed
    rng.shuffle(noisy)
    files = {
        "train": write_parallel("train", noisy, suffix=".gz"),
        "valid": write_parallel("valid", toy_pairs(12, 20)),
    }
    prepared = _prepare(files, tmp_path / "cache")
    stats = prepared.summary["splits"]["train"]
    assert stats["pairs_read"] == len(noisy)
    assert stats["dropped"] == {"empty": 3, "too_long": 2, "length_ratio": 3}
    assert stats["pairs_kept"] == len(clean) == len(prepared.splits["train"])
    train = prepared.splits["train"]
    assert train.src_lengths.min() > 0 and train.tgt_lengths.min() > 0
    assert max(train.src_lengths.max(), train.tgt_lengths.max()) <= FILTER.max_length
    # Kept pairs stay aligned: the toy target is the source's words reversed.
    decoded_src = prepared.tokenizers.src.decode([train[i][0] for i in range(len(train))])
    decoded_tgt = prepared.tokenizers.tgt.decode([train[i][1] for i in range(len(train))])
    assert all(
        t == " ".join(reversed(s.split())) for s, t in zip(decoded_src, decoded_tgt, strict=True)
    )
    assert sorted(decoded_src) == sorted(src for src, _ in clean)


def test_valid_and_test_are_never_filtered(write_parallel, toy_pairs, tmp_path: Path) -> None:
    odd = [("", ""), ("ka", ""), (" ".join(["kalo"] * 60), "lo"), ("mi", "mi " * 20)]
    valid = toy_pairs(21, 10) + odd + toy_pairs(22, 5)
    test = odd + toy_pairs(23, 3)
    files = {
        "train": write_parallel("train", toy_pairs(20, 200)),
        "valid": write_parallel("valid", valid),
        "test": write_parallel("test", test, suffix=".gz"),
    }
    prepared = _prepare(files, tmp_path / "cache")
    for split, pairs in (("valid", valid), ("test", test)):
        dataset = prepared.splits[split]
        stats = prepared.summary["splits"][split]
        assert len(dataset) == len(pairs) == stats["pairs_read"] == stats["pairs_kept"]
        assert not stats["filtered"]
        src_text = read_lines(prepared.raw_files[split][0])
        decoded = prepared.tokenizers.src.decode([dataset[i][0] for i in range(len(dataset))])
        assert decoded == [" ".join(line.split()) for line in src_text]
    empty_row = valid.index(("", ""))
    assert len(prepared.splits["valid"][empty_row][0]) == 0
    assert len(prepared.splits["valid"][empty_row][1]) == 0


def test_cache_is_reused_and_invalidated(small_corpus, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _prepare(small_corpus, cache)
    assert not first.cache_hit
    assert (first.cache_dir / "summary.json").is_file()
    second = _prepare(small_corpus, cache)
    assert second.cache_hit and second.summary["cache_hit"]
    assert second.cache_dir == first.cache_dir
    assert second.tokenizers.src.to_bytes() == first.tokenizers.src.to_bytes()
    for split, dataset in first.splits.items():
        assert _side(second.splits[split], 0) == _side(dataset, 0)
    assert "cache hit" in second.format_summary()

    # A different tokenizer setting: a new cache next to the old one.
    bigger = TokenizerSettings(model_type="bpe", vocab_size=110, joint=True, seed=1)
    third = _prepare(small_corpus, cache, tokenizer=bigger)
    assert not third.cache_hit and third.cache_dir != first.cache_dir
    # A different filter setting too.
    fourth = _prepare(
        small_corpus, cache, filter=FilterSettings(max_length=30, max_length_ratio=3.0)
    )
    assert not fourth.cache_hit and fourth.cache_dir not in (first.cache_dir, third.cache_dir)

    # A data file changed in place, same size: noticed through its modification time.
    src, _ = small_corpus["valid"]
    text = src.read_bytes()
    position = text.index(b"a")
    src.write_bytes(text[:position] + b"e" + text[position + 1 :])
    status = src.stat()
    os.utime(src, ns=(status.st_atime_ns, status.st_mtime_ns + 2_000_000_000))
    fifth = _prepare(small_corpus, cache)
    assert not fifth.cache_hit
    assert fifth.cache_dir not in (first.cache_dir, third.cache_dir, fourth.cache_dir)
    assert _cache_entries(cache) == sorted(
        path.name for path in (first.cache_dir, third.cache_dir, fourth.cache_dir, fifth.cache_dir)
    )


def test_storage_format(small_corpus, tmp_path: Path) -> None:
    prepared = _prepare(small_corpus, tmp_path / "cache")
    train = prepared.splits["train"]
    assert isinstance(train.src._tokens, np.memmap) and train[0][0].dtype == np.uint16
    offsets = np.load(prepared.cache_dir / "train.src.offsets.npy")
    assert offsets.dtype == np.int64 and len(offsets) == len(train) + 1
    stored = np.load(prepared.cache_dir / "train.tgt.tokens.npy", mmap_mode="r")
    assert stored.tolist() == [token for ids in _side(train, 1) for token in ids]
    summary = json.loads((prepared.cache_dir / "summary.json").read_text())
    # The target side of the joint model keeps only the pieces its training text uses.
    assert summary["vocab_size"] == {"src": 100, "tgt": prepared.tokenizers.tgt.vocab_size}
    assert summary["splits"]["test"]["pairs_read"] == 50
    table = prepared.format_summary()
    for word in ("train", "valid", "test", "400", "joint bpe", "100 pieces"):
        assert word in table


def test_separate_tokenizers(small_corpus, tmp_path: Path) -> None:
    settings = TokenizerSettings(model_type="unigram", vocab_size=70, joint=False, seed=1)
    prepared = _prepare(small_corpus, tmp_path / "cache", tokenizer=settings)
    assert not prepared.tokenizers.joint
    assert prepared.tokenizers.src is not prepared.tokenizers.tgt
    assert (prepared.cache_dir / "src.model").is_file() and (
        prepared.cache_dir / "tgt.model"
    ).is_file()
    assert prepared.tokenizers.src.decode(prepared.tokenizers.src.encode(["kalo mi"])) == [
        "kalo mi"
    ]


def test_line_count_mismatch_leaves_no_cache(write_parallel, toy_pairs, tmp_path: Path) -> None:
    files = {
        "train": write_parallel("train", toy_pairs(30, 100)),
        "valid": write_parallel("valid", toy_pairs(31, 10)),
    }
    src, tgt = files["valid"]
    tgt.write_text(tgt.read_text() + "one more line\n")
    cache = tmp_path / "cache"
    with pytest.raises(DataError) as caught:
        _prepare(files, cache)
    assert f"{src} has 10 lines" in str(caught.value) and f"{tgt} has 11 lines" in str(caught.value)
    assert _cache_entries(cache) == []


def test_invalid_utf8_in_training_data_leaves_no_cache(
    write_parallel, toy_pairs, tmp_path: Path
) -> None:
    files = {
        "train": write_parallel("train", toy_pairs(32, 100)),
        "valid": write_parallel("valid", toy_pairs(33, 10)),
    }
    src = files["train"][0]
    lines = src.read_bytes().split(b"\n")
    lines[41] = b"caf\xe9 latin-1"
    src.write_bytes(b"\n".join(lines))
    cache = tmp_path / "cache"
    with pytest.raises(DataError) as caught:
        _prepare(files, cache)
    assert str(src) in str(caught.value) and "line 42" in str(caught.value)
    assert _cache_entries(cache) == []


def test_missing_file(small_corpus, tmp_path: Path) -> None:
    files = dict(small_corpus)
    files["test"] = (tmp_path / "absent.src", small_corpus["test"][1])
    with pytest.raises(DataError, match="absent.src"):
        _prepare(files, tmp_path / "cache")


def test_files_config(small_corpus, tmp_path: Path) -> None:
    config = {
        "kind": "files",
        "train": {"src": str(small_corpus["train"][0]), "tgt": str(small_corpus["train"][1])},
        "valid": {"src": str(small_corpus["valid"][0]), "tgt": str(small_corpus["valid"][1])},
        "test": {"src": None, "tgt": None},
    }
    assert set(corpus_files_from_config(config)) == {"train", "valid"}
    with pytest.raises(DataError, match=r"data\.valid\.tgt is not set"):
        corpus_files_from_config({**config, "valid": {"src": config["valid"]["src"], "tgt": "???"}})
    with pytest.raises(DataError, match=r"file not found: .*nope\.txt \(data\.test\.src\)"):
        corpus_files_from_config(
            {**config, "test": {"src": "nope.txt", "tgt": config["valid"]["tgt"]}}
        )
    with pytest.raises(DataError, match="unknown data.kind"):
        corpus_files_from_config({**config, "kind": "ftp"})
    root = {
        "data": {**config, "filter": {"max_length": 50, "max_length_ratio": 2}},
        "tokenizer": {"model_type": "bpe", "vocab_size": 90, "joint": True, "seed": 2},
        "paths": {"cache_dir": str(tmp_path / "cache")},
    }
    prepared = prepare_from_config(root)
    assert prepared.summary["filter"] == {"max_length": 50, "max_length_ratio": 2.0}
    assert prepared.tokenizers.src.vocab_size == 90 and set(prepared.splits) == {"train", "valid"}


def test_config_is_plain_containers_with_unset_values_named(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    # What a Hydra app hands over: OmegaConf.to_container keeps unset values as "???".
    root = OmegaConf.to_container(
        OmegaConf.create({
            "data": {"kind": "files"},
            "tokenizer": {"vocab_size": 90},
            "paths": {"cache_dir": "???"},
        }),
        resolve=True,
    )
    with pytest.raises(DataError, match=r"^paths\.cache_dir is not set$"):
        prepare_from_config(root)
    root["paths"]["cache_dir"] = str(tmp_path / "cache")
    with pytest.raises(DataError, match=r"^data\.train is not set$"):
        prepare_from_config(root)


def test_the_data_package_does_not_import_omegaconf_or_hydra() -> None:
    code = (
        "import importlib, pkgutil, sys\n"
        "import seq2seq.data\n"
        "for module in pkgutil.iter_modules(seq2seq.data.__path__):\n"
        "    importlib.import_module(f'seq2seq.data.{module.name}')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('omegaconf', 'hydra')))"
    )
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True,
        timeout=120, check=True,
    )
    assert done.stdout.strip() == "[]"


def _run_cli(arguments: list[str], cwd: Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    return subprocess.run(
        [sys.executable, "-m", "seq2seq.cli.prepare_data", *arguments],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_command_line(small_corpus, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    arguments = [
        "data=files",
        f"data.train.src={small_corpus['train'][0]}",
        f"data.train.tgt={small_corpus['train'][1]}",
        f"data.valid.src={small_corpus['valid'][0]}",
        f"data.valid.tgt={small_corpus['valid'][1]}",
        "tokenizer.vocab_size=100",
        "paths.data_dir=data",
    ]
    done = _run_cli(arguments, workdir)
    assert done.returncode == 0, done.stderr
    assert "Data summary" in done.stdout and "valid" in done.stdout
    # Hydra must not leave output folders or log files behind: only the data cache.
    assert sorted(path.name for path in workdir.iterdir()) == ["data"]

    broken = _run_cli(
        [*arguments[:-3], "data.valid.tgt=missing.txt", "paths.data_dir=data"], workdir
    )
    assert broken.returncode == 1
    assert broken.stderr.strip().splitlines() == [
        "error: file not found: missing.txt (data.valid.tgt)"
    ]


def test_joint_target_vocabulary_is_pruned_to_pieces_seen_in_training_targets(
    write_parallel, tmp_path: Path
) -> None:
    rng = random.Random(7)
    # Lower-case sources, upper-case targets: a joint model holds pieces only one side uses.
    train_pairs, valid_pairs = [], []
    for pairs, count in ((train_pairs, 300), (valid_pairs, 30)):
        for _ in range(count):
            words = [rng.choice(["kalo", "mipe", "nura", "sito", "vezu"]) for _ in range(4)]
            pairs.append((" ".join(words), " ".join(w.upper() for w in words)))
    valid_pairs.append(("kalo", "QQQ"))  # a target piece never seen in training
    files = {"train": write_parallel("train", train_pairs),
             "valid": write_parallel("valid", valid_pairs)}
    prepared = _prepare(files, tmp_path / "cache")
    source, target = prepared.tokenizers.src, prepared.tokenizers.tgt
    assert target.vocab_size < source.vocab_size
    assert prepared.summary["vocab_size"]["tgt"] == target.vocab_size
    for split in ("train", "valid"):
        stored = np.load(prepared.cache_dir / f"{split}.tgt.tokens.npy")
        assert int(stored.max()) < target.vocab_size
    # The targets decode back to their text; the unseen piece is UNK, nothing else changes.
    train_ids = [prepared.splits["train"][i][1].tolist() for i in range(5)]
    assert target.decode(train_ids) == [t for _, t in train_pairs[:5]]
    assert target.decode_pieces([target.pieces(ids) for ids in train_ids]) == target.decode(
        train_ids)
    assert 1 in prepared.splits["valid"][30][1].tolist()  # UNK_ID
    # Rounded up to 64 output rows with the unseen pieces of the highest ids.
    occurring = set(target.kept_ids[np.unique(np.load(
        prepared.cache_dir / "train.tgt.tokens.npy"))].tolist()) | {0, 1, 2, 3}
    unseen = [i for i in range(source.vocab_size) if i not in occurring]
    assert len(occurring) % 64 != 0 and target.vocab_size == 64
    assert sorted(target.kept_ids.tolist()) == sorted(occurring | set(unseen[-(64 - len(occurring)):]))
    # The same subset comes back from the cache and from a checkpoint payload.
    again = _prepare(files, tmp_path / "cache")
    assert again.cache_hit and np.array_equal(again.tokenizers.tgt.kept_ids, target.kept_ids)
    from seq2seq.checkpoint import tokenizers_from_payload, tokenizers_to_payload

    restored = tokenizers_from_payload(tokenizers_to_payload(prepared.tokenizers)).tgt
    assert np.array_equal(restored.kept_ids, target.kept_ids)
    assert restored.encode(["KALO MIPE"]) == target.encode(["KALO MIPE"])


def test_fillers_round_the_kept_pieces_up_with_the_highest_unseen_ids_but_never_an_excluded_one():
    seen = np.zeros(20, dtype=bool)
    seen[[0, 1, 2, 3, 9]] = True  # 5 kept
    assert fillers_to_a_multiple(seen, excluded=[19], multiple=8).tolist() == [16, 17, 18]
    assert fillers_to_a_multiple(seen, excluded=[], multiple=8).tolist() == [17, 18, 19]
    assert fillers_to_a_multiple(seen, excluded=[19], multiple=5).tolist() == []  # a multiple
    assert fillers_to_a_multiple(seen, excluded=[19], multiple=32).tolist() == []  # out of reach


def test_pruning_can_be_turned_off(small_corpus, tmp_path: Path) -> None:
    settings = TokenizerSettings(model_type="bpe", vocab_size=100, joint=True, seed=1,
                                 prune_target_vocabulary=False)
    prepared = _prepare(small_corpus, tmp_path / "cache", tokenizer=settings)
    assert prepared.tokenizers.tgt is prepared.tokenizers.src
