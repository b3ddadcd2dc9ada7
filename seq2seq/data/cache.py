"""The on-disk cache of prepared data: its key, its layout, and building it all or nothing.

What the key hashes (FORMAT_VERSION among it) and how a folder is built under a temporary
name and renamed into place: docs/data.md#the-cache. `summary.json`, written last, marks a
complete one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from seq2seq.atomic import default_permissions, write_text
from seq2seq.data.dataset import ParallelDataset
from seq2seq.data.settings import FilterSettings, TokenizerSettings
from seq2seq.data.tokenizer import SentencePieceTokenizer, SubsetTokenizer, Tokenizers

logger = logging.getLogger(__name__)

# Bump whenever the cache layout or the meaning of its content changes: old caches are then
# simply not found (and can be deleted by hand).
FORMAT_VERSION = 3  # 3: the kept target pieces rounded up to a multiple of 64

SUMMARY_FILE = "summary.json"
FILE_HASHES_FILE = "file_hashes.json"
JOINT_MODEL_FILE = "tokenizer.model"
SIDE_MODEL_FILES = {"src": "src.model", "tgt": "tgt.model"}
TARGET_VOCABULARY_FILE = "tgt_vocabulary.npy"
_TEMPORARY_PREFIX = ".tmp-"
# Older than this, a temporary build directory belongs to a crashed run, not a running one.
_STALE_TEMPORARY_SECONDS = 24 * 3600


def cache_key(
    *,
    digests: Mapping[str, tuple[str, str]],
    tokenizer: TokenizerSettings,
    filter: FilterSettings,
    train_corpora: Sequence[tuple[str, str, str | None]] | None = None,
) -> str:
    """The name of the cache directory of these inputs.

    Args:
        digests: Split name -> SHA-256 of (source file, target file).
        train_corpora: With several training corpora or a tag (then `digests` has no
            "train"): (source SHA-256, target SHA-256, tag) of each, in order. None keeps
            the key of a single untagged corpus what it always was.
    """
    material: dict = {
        "format_version": FORMAT_VERSION,
        "files": {split: list(pair) for split, pair in sorted(digests.items())},
        "tokenizer": dataclasses.asdict(tokenizer),
        "filter": dataclasses.asdict(filter),
    }
    if train_corpora is not None:
        material["train_corpora"] = [list(corpus) for corpus in train_corpora]
    encoded = json.dumps(material, sort_keys=True).encode("utf-8")
    return hashlib.sha256(encoded).hexdigest()[:24]


def read_summary(directory: Path) -> dict[str, Any] | None:
    """Returns the summary of a complete cache, or None (discarding a broken or outdated one)."""
    try:
        summary = json.loads((directory / SUMMARY_FILE).read_text("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        logger.warning("cache %s has an unreadable summary (%s): rebuilding it", directory, error)
        discard(directory)
        return None
    if summary.get("format_version") != FORMAT_VERSION:
        discard(directory)
        return None
    return summary


def discard(directory: Path) -> None:
    """Deletes a broken cache, renaming it first so that its key is free at once."""
    trash = directory.with_name(f"{_TEMPORARY_PREFIX}{directory.name}-broken-{os.getpid()}")
    try:
        os.replace(directory, trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def build_into_place(
    *, directory: Path, build: Callable[[Path], dict[str, Any]]
) -> dict[str, Any]:
    """Builds a cache in a temporary directory and renames it to `directory` when complete.

    Args:
        build: Fills the folder it is given and returns the summary (JSON-serializable).

    Returns:
        The summary; another process's if it completed the same cache first.

    Raises:
        Whatever `build` raises; no directory is left behind then.
    """
    _remove_stale_temporaries(directory.parent)
    temporary = Path(
        tempfile.mkdtemp(prefix=f"{_TEMPORARY_PREFIX}{directory.name}-", dir=directory.parent)
    )
    try:
        summary = {"format_version": FORMAT_VERSION, **build(temporary)}
        # Written last: its presence marks a complete cache.
        write_text(temporary / SUMMARY_FILE, json.dumps(summary, indent=1))
        default_permissions(temporary, directory=True)
        try:
            os.rename(temporary, directory)
        except OSError:
            if not (directory / SUMMARY_FILE).is_file():
                raise
            # Another process (e.g. another rank) finished the same cache first: use theirs.
            logger.info("cache %s was built concurrently; using that one", directory)
            stored = read_summary(directory)
            if stored is None:
                raise
            summary = stored
    finally:
        if temporary.exists():
            shutil.rmtree(temporary, ignore_errors=True)
    logger.info("data cache written to %s", directory)
    return summary


def _remove_stale_temporaries(cache_root: Path) -> None:
    now = time.time()
    for entry in cache_root.glob(f"{_TEMPORARY_PREFIX}*"):
        try:
            if entry.is_dir() and now - entry.stat().st_mtime > _STALE_TEMPORARY_SECONDS:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            continue


def save_tokenizers(*, directory: Path, tokenizers: Tokenizers) -> None:
    """Stores the model(s), and a pruned target vocabulary's kept ids, in a cache directory."""
    if not tokenizers.joint:
        tokenizers.src.save(directory / SIDE_MODEL_FILES["src"])
        tokenizers.tgt.save(directory / SIDE_MODEL_FILES["tgt"])
        return
    tokenizers.src.save(directory / JOINT_MODEL_FILE)
    if isinstance(tokenizers.tgt, SubsetTokenizer):
        np.save(directory / TARGET_VOCABULARY_FILE, tokenizers.tgt.kept_ids)


def load_cache(
    *, directory: Path, summary: Mapping[str, Any]
) -> tuple[Tokenizers, dict[str, ParallelDataset]]:
    """Opens a complete cache: its tokenizers, and its splits memory-mapped.

    Raises:
        OSError, ValueError, KeyError: If a file is missing or damaged.
    """
    if summary.get("joint"):
        kept_ids_file = directory / TARGET_VOCABULARY_FILE
        tokenizers = Tokenizers.of(
            SentencePieceTokenizer.load(directory / JOINT_MODEL_FILE),
            kept_ids=np.load(kept_ids_file) if kept_ids_file.is_file() else None,
        )
    else:
        tokenizers = Tokenizers.of(
            SentencePieceTokenizer.load(directory / SIDE_MODEL_FILES["src"]),
            SentencePieceTokenizer.load(directory / SIDE_MODEL_FILES["tgt"]),
        )
    splits = {split: ParallelDataset.load(directory / split) for split in summary["splits"]}
    return tokenizers, splits
