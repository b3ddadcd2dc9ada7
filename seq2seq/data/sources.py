"""Resolving the `data` config node to local parallel files: listed files, or Multi30k fetched.

This is the one place that dispatches on `data.kind`; everything after it sees only
split name -> (source file, target file).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from seq2seq.data.multi30k import DEFAULT_BASE_URL, fetch_multi30k
from seq2seq.data.settings import get_setting
from seq2seq.data.text_files import DataError

TRAIN_SPLIT = "train"
_FILE_SPLITS = (TRAIN_SPLIT, "valid", "test")
_OPTIONAL_SPLITS = ("test",)


def corpus_files_from_config(data_cfg: Mapping[str, Any]) -> dict[str, tuple[Path, Path]]:
    """Resolves the `data` config node to local parallel files, fetching Multi30k if needed.

    Args:
        data_cfg: The `data` node: kind "multi30k" (src_lang, tgt_lang, base_url, dir,
            splits) or kind "files" (train/valid/test with src and tgt paths; test optional).

    Returns:
        Split name -> (source file, target file). A `data.train` list of several corpora is
        left out: `seq2seq.data.corpora.train_corpora_from_config` reads it.

    Raises:
        DataError: On an unknown kind, unset or missing files, or a failed Multi30k fetch.
    """
    kind = get_setting(data_cfg, "kind", where="data")
    if kind == "multi30k":
        return _multi30k_files(data_cfg)
    if kind == "files":
        return _listed_files(data_cfg)
    raise DataError(f"unknown data.kind {kind!r}: expected 'multi30k' or 'files'")


def _multi30k_files(data_cfg: Mapping[str, Any]) -> dict[str, tuple[Path, Path]]:
    splits = {
        str(ours): (None if theirs is None else str(theirs))
        for ours, theirs in get_setting(data_cfg, "splits", where="data").items()
    }
    if splits.get(TRAIN_SPLIT) is None:
        raise DataError(f"data.splits.{TRAIN_SPLIT} is not set")
    return fetch_multi30k(
        base_url=str(get_setting(data_cfg, "base_url", where="data", default=DEFAULT_BASE_URL)),
        directory=Path(str(get_setting(data_cfg, "dir", where="data"))).expanduser(),
        src_lang=str(get_setting(data_cfg, "src_lang", where="data")),
        tgt_lang=str(get_setting(data_cfg, "tgt_lang", where="data")),
        splits=splits,
    )


def _listed_files(data_cfg: Mapping[str, Any]) -> dict[str, tuple[Path, Path]]:
    files: dict[str, tuple[Path, Path]] = {}
    for split in _FILE_SPLITS:
        where = f"data.{split}"
        split_cfg = get_setting(data_cfg, split, where="data", default=None)
        if split == TRAIN_SPLIT and isinstance(split_cfg, Sequence) and not isinstance(
            split_cfg, str
        ):
            continue  # several corpora (seq2seq.data.corpora)
        if split_cfg is None:
            if split in _OPTIONAL_SPLITS:
                continue
            raise DataError(f"{where} is not set")
        src = _path_setting(split_cfg, "src", where=where)
        tgt = _path_setting(split_cfg, "tgt", where=where)
        if split in _OPTIONAL_SPLITS and src is None and tgt is None:
            continue
        if src is None or tgt is None:
            raise DataError(f"{where}.{'src' if src is None else 'tgt'} is not set")
        for side, path in (("src", src), ("tgt", tgt)):
            if not path.is_file():
                raise DataError(f"file not found: {path} ({where}.{side})")
        files[split] = (src, tgt)
    return files


def _path_setting(config: Mapping[str, Any], key: str, *, where: str) -> Path | None:
    value = get_setting(config, key, where=where, default=None)
    return None if value is None else Path(str(value)).expanduser()
