"""Real Multi30k de-en through the whole data stage (needs the mirror or local data)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from seq2seq.data.multi30k import DEFAULT_BASE_URL
from seq2seq.data.prepare import prepare_from_config

pytestmark = pytest.mark.integration

REPOSITORY = Path(__file__).resolve().parents[1]
LOCAL_DATA = REPOSITORY / "data" / "multi30k"
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}


def _is_fetched(directory: Path) -> bool:
    """Whether every de/en file of SPLITS is present (checksums are checked when fetching)."""
    return all(
        (directory / f"{split}.{language}.gz").is_file()
        for split in SPLITS.values()
        for language in ("de", "en")
    )


def _source(tmp_path: Path) -> tuple[str, Path] | None:
    """(base URL, directory to fetch into), or None when no data can be had offline."""
    url = os.environ.get("SEQ2SEQ_MULTI30K_URL")
    if url:
        # A fresh copy per run, so the fetch itself is exercised too.
        return url, tmp_path / "multi30k"
    if _is_fetched(LOCAL_DATA):
        # Already fetched: nothing is downloaded (the files are only verified).
        return DEFAULT_BASE_URL, LOCAL_DATA
    return None


def test_multi30k_de_en(tmp_path: Path) -> None:
    source = _source(tmp_path)
    if source is None:
        pytest.skip(f"SEQ2SEQ_MULTI30K_URL is unset and {LOCAL_DATA} holds no de-en Multi30k data")
    base_url, directory = source
    config = {
        "data": {
            "kind": "multi30k",
            "src_lang": "de",
            "tgt_lang": "en",
            "base_url": base_url,
            "dir": str(directory),
            "splits": SPLITS,
            "filter": {"max_length": 100, "max_length_ratio": 3.0},
        },
        "tokenizer": {"model_type": "bpe", "vocab_size": 2000, "joint": True, "seed": 1},
        "paths": {"cache_dir": str(tmp_path / "cache")},
    }
    prepared = prepare_from_config(config)
    splits = prepared.summary["splits"]
    assert {name: stats["pairs_read"] for name, stats in splits.items()} == {
        "train": 29000,
        "valid": 1014,
        "test": 1000,
    }
    assert 28_000 < splits["train"]["pairs_kept"] <= 29000
    for name in ("valid", "test"):
        assert splits[name]["pairs_kept"] == splits[name]["pairs_read"]
        assert len(prepared.splits[name]) == splits[name]["pairs_read"]
    assert prepared.tokenizers.src.vocab_size == 2000
    assert 10 < splits["train"]["src_mean_pieces"] < 40
    print(prepared.format_summary())

    again = prepare_from_config(config)
    assert again.cache_hit and again.cache_dir == prepared.cache_dir
