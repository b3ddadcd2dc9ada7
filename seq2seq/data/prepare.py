"""The data stage: raw parallel text in, tokenizers and memory-mapped encoded splits out.

Everything derived from the raw files lives in `<cache_dir>/<key>/`, where the key hashes the
raw files' contents, the tokenizer and filter settings and FORMAT_VERSION. A cache directory is
built under a temporary name and renamed into place when complete, so it either exists whole
or not at all; a second run with the same inputs only memory-maps it.

Pipeline of a build:
1. every split but train is read once to check it (line counts, UTF-8): cheap, and it fails
   before the expensive steps;
2. the tokenizer(s) are trained on the non-empty training pairs, streamed from disk;
3. each split is encoded in chunks and appended to flat token files. Only training pairs are
   filtered (empty side, too long, length ratio); other splits keep every line, in order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from seq2seq.data.corpus import (
    DataError,
    apply_default_permissions,
    check_parallel,
    iter_parallel_chunks,
    sha256_file,
)
from seq2seq.data.dataset import ParallelDataset, TokenArrayWriter
from seq2seq.data.multi30k import DEFAULT_BASE_URL, fetch_multi30k
from seq2seq.data.tokenizer import (
    MODEL_TYPES,
    SentencePieceTokenizer,
    SubsetTokenizer,
    Tokenizers,
)
from seq2seq.data.vocab import UNK_ID

logger = logging.getLogger(__name__)

# Bump whenever the cache layout or the meaning of its content changes: old caches are then
# simply not found (and can be deleted by hand).
FORMAT_VERSION = 2

TRAIN_SPLIT = "train"
SUMMARY_FILE = "summary.json"
FILE_HASHES_FILE = "file_hashes.json"
JOINT_MODEL_FILE = "tokenizer.model"
SIDE_MODEL_FILES = {"src": "src.model", "tgt": "tgt.model"}
TARGET_VOCABULARY_FILE = "tgt_vocabulary.npy"
DROP_REASONS = ("empty", "too_long", "length_ratio")
ENCODE_CHUNK_LINES = 10_000
_TEMPORARY_PREFIX = ".tmp-"
_STALE_TEMPORARY_SECONDS = 24 * 3600
_MISSING = "???"


@dataclass(frozen=True, kw_only=True)
class TokenizerSettings:
    """How the sentencepiece model(s) are trained (the `tokenizer` config group).

    Attributes:
        model_type: "bpe" or "unigram".
        vocab_size: Wanted pieces per model, lowered with a warning if the text supports fewer.
        joint: One model for both sides (trained on source and target text) or one each.
        character_coverage: Share of characters covered by the model.
        max_training_sentences: Sentences sampled (per model) to train on.
        seed: Seed of the sampling.
        prune_target_vocabulary: With a joint model, give the target side (the output layer)
            only the pieces seen in the training targets.
    """

    model_type: str = "bpe"
    vocab_size: int = 8000
    joint: bool = True
    character_coverage: float = 1.0
    max_training_sentences: int = 2_000_000
    seed: int = 1
    prune_target_vocabulary: bool = True

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise DataError(
                f"unknown tokenizer.model_type {self.model_type!r}: expected one of "
                f"{', '.join(MODEL_TYPES)}"
            )
        if self.vocab_size < 5:
            raise DataError(f"tokenizer.vocab_size must be at least 5, got {self.vocab_size}")
        if not 0.0 < self.character_coverage <= 1.0:
            raise DataError(
                f"tokenizer.character_coverage must be in (0, 1], got {self.character_coverage}"
            )

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TokenizerSettings:
        """Reads the settings from a mapping such as the `tokenizer` config node.

        Keys not listed as attributes are ignored; missing keys take the defaults.
        """
        defaults = cls()
        return cls(
            model_type=str(_get(config, "model_type", "tokenizer", defaults.model_type)),
            vocab_size=int(_get(config, "vocab_size", "tokenizer", defaults.vocab_size)),
            joint=bool(_get(config, "joint", "tokenizer", defaults.joint)),
            character_coverage=float(
                _get(config, "character_coverage", "tokenizer", defaults.character_coverage)
            ),
            max_training_sentences=int(
                _get(config, "max_training_sentences", "tokenizer", defaults.max_training_sentences)
            ),
            seed=int(_get(config, "seed", "tokenizer", defaults.seed)),
            prune_target_vocabulary=bool(
                _get(config, "prune_target_vocabulary", "tokenizer",
                     defaults.prune_target_vocabulary)
            ),
        )


@dataclass(frozen=True, kw_only=True)
class FilterSettings:
    """Which training pairs are dropped (the `data.filter` config node).

    Attributes:
        max_length: Pairs with more pieces than this on either side are dropped (None: no
            limit).
        max_length_ratio: Pairs whose longer side has more than this times the pieces of the
            shorter are dropped (None: no limit).
    """

    max_length: int | None = 100
    max_length_ratio: float | None = 3.0

    def __post_init__(self) -> None:
        if self.max_length is not None and self.max_length < 1:
            raise DataError(f"data.filter.max_length must be positive, got {self.max_length}")
        if self.max_length_ratio is not None and self.max_length_ratio < 1.0:
            raise DataError(
                f"data.filter.max_length_ratio must be at least 1, got {self.max_length_ratio}"
            )

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> FilterSettings:
        """Reads the settings from a mapping such as `data.filter` (None: defaults)."""
        if config is None:
            return cls()
        defaults = cls()
        max_length = _get(config, "max_length", "data.filter", defaults.max_length)
        ratio = _get(config, "max_length_ratio", "data.filter", defaults.max_length_ratio)
        return cls(
            max_length=None if max_length is None else int(max_length),
            max_length_ratio=None if ratio is None else float(ratio),
        )


@dataclass(kw_only=True)
class PreparedData:
    """The result of `prepare_data`.

    Attributes:
        tokenizers: The source/target tokenizer(s).
        splits: Split name -> encoded pairs (memory-mapped).
        raw_files: Split name -> (source text file, target text file), e.g. to score BLEU
            against the raw references (valid/test line i answers encoded pair i).
        summary: Counts, vocabulary sizes, timings (also in `cache_dir / summary.json`).
        cache_hit: Whether an existing cache was reused.
        cache_dir: The cache directory of these inputs.
    """

    tokenizers: Tokenizers
    splits: dict[str, ParallelDataset]
    raw_files: dict[str, tuple[Path, Path]]
    summary: dict[str, Any]
    cache_hit: bool
    cache_dir: Path
    languages: tuple[str, str] | None = field(default=None)

    def format_summary(self) -> str:
        """Returns the summary as a printable table."""
        return format_summary(self.summary)


def _get(config: Mapping[str, Any], key: str, where: str, default: Any = _MISSING) -> Any:
    """Reads `config[key]`, treating OmegaConf's "???" (unset mandatory value) as missing."""
    try:
        value = config[key]
    except KeyError:
        value = _MISSING
    except Exception as error:
        # An OmegaConf DictConfig raises MissingMandatoryValue for "???"; omegaconf itself is
        # not imported so that plain dicts work without it.
        if type(error).__name__ != "MissingMandatoryValue":
            raise
        value = _MISSING
    if isinstance(value, str) and value == _MISSING:
        if default is _MISSING:
            raise DataError(f"{where}.{key} is not set")
        return default
    return value


def _path_setting(config: Mapping[str, Any], key: str, where: str) -> Path | None:
    value = _get(config, key, where, None)
    return None if value is None else Path(str(value)).expanduser()


def corpus_files_from_config(data_cfg: Mapping[str, Any]) -> dict[str, tuple[Path, Path]]:
    """Resolves the `data` config node to local parallel files, fetching Multi30k if needed.

    Args:
        data_cfg: The `data` node: kind "multi30k" (src_lang, tgt_lang, base_url, dir,
            splits) or kind "files" (train/valid/test with src and tgt paths; test optional).

    Returns:
        Split name -> (source file, target file).

    Raises:
        DataError: On an unknown kind, unset or missing files, or a failed Multi30k fetch.
    """
    kind = _get(data_cfg, "kind", "data")
    if kind == "multi30k":
        splits_cfg = _get(data_cfg, "splits", "data")
        splits = {
            str(ours): (None if theirs is None else str(theirs))
            for ours, theirs in splits_cfg.items()
        }
        if splits.get(TRAIN_SPLIT) is None:
            raise DataError("data.splits.train is not set")
        return fetch_multi30k(
            base_url=str(_get(data_cfg, "base_url", "data", DEFAULT_BASE_URL)),
            directory=Path(str(_get(data_cfg, "dir", "data"))).expanduser(),
            src_lang=str(_get(data_cfg, "src_lang", "data")),
            tgt_lang=str(_get(data_cfg, "tgt_lang", "data")),
            splits=splits,
        )
    if kind == "files":
        files: dict[str, tuple[Path, Path]] = {}
        for split in ("train", "valid", "test"):
            split_cfg = _get(data_cfg, split, "data", None)
            where = f"data.{split}"
            if split_cfg is None:
                if split == "test":
                    continue
                raise DataError(f"{where} is not set")
            src = _path_setting(split_cfg, "src", where)
            tgt = _path_setting(split_cfg, "tgt", where)
            if split == "test" and src is None and tgt is None:
                continue
            if src is None or tgt is None:
                unset = "src" if src is None else "tgt"
                raise DataError(f"{where}.{unset} is not set")
            for side, path in (("src", src), ("tgt", tgt)):
                if not path.is_file():
                    raise DataError(f"file not found: {path} ({where}.{side})")
            files[split] = (src, tgt)
        return files
    raise DataError(f"unknown data.kind {kind!r}: expected 'multi30k' or 'files'")


class _FileHashCache:
    """SHA-256 of data files, remembered by (path, size, mtime, inode) in a small json file.

    Hashing a multi-gigabyte corpus takes seconds; a stat call does not, which keeps a cached
    run fast. A file rewritten in place gets a new mtime (and usually size), hence a new hash.
    """

    def __init__(self, *, path: Path) -> None:
        self._path = path
        self._changed = False
        try:
            self._entries: dict[str, dict[str, Any]] = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError):
            self._entries = {}

    def digest(self, file: Path) -> str:
        try:
            status = file.stat()
        except FileNotFoundError:
            raise DataError(f"file not found: {file}") from None
        key = str(file.resolve())
        identity = [status.st_size, status.st_mtime_ns, status.st_ino]
        entry = self._entries.get(key)
        if entry is not None and entry.get("identity") == identity:
            return str(entry["sha256"])
        digest = sha256_file(file)
        self._entries[key] = {"identity": identity, "sha256": digest}
        self._changed = True
        return digest

    def save(self) -> None:
        if not self._changed:
            return
        try:
            _write_text_atomically(self._path, json.dumps(self._entries, indent=1, sort_keys=True))
        except OSError as error:
            # Only a speed-up: failing to remember hashes must not fail the run.
            logger.warning("cannot update %s: %s", self._path, error)


def _write_text_atomically(path: Path, text: str) -> None:
    descriptor, temporary_name = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=".tmp", dir=path.parent
    )
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(text)
        apply_default_permissions(Path(temporary_name))
        os.replace(temporary_name, path)
    finally:
        Path(temporary_name).unlink(missing_ok=True)


def _cache_key(
    digests: Mapping[str, tuple[str, str]], tokenizer: TokenizerSettings, filter: FilterSettings
) -> str:
    material = {
        "format_version": FORMAT_VERSION,
        "files": {split: list(pair) for split, pair in sorted(digests.items())},
        "tokenizer": dataclasses.asdict(tokenizer),
        "filter": dataclasses.asdict(filter),
    }
    encoded = json.dumps(material, sort_keys=True).encode("utf-8")
    return hashlib.sha256(encoded).hexdigest()[:24]


def _progress(*, description: str, enabled: bool | None) -> Any:
    """A tqdm bar on stderr, shown only for steps lasting more than a couple of seconds."""
    from tqdm import tqdm

    return tqdm(
        desc=description,
        unit=" pairs",
        unit_scale=True,
        file=sys.stderr,
        delay=2.0,
        leave=False,
        disable=None if enabled is None else not enabled,
    )


class _TrainingSentences:
    """Re-iterable stream of the non-empty training pairs' sentences, read from disk.

    Re-iterable so that sentencepiece training can be repeated (see
    SentencePieceTokenizer.train) without holding the corpus in memory.
    """

    def __init__(
        self, *, src_path: Path, tgt_path: Path, sides: tuple[str, ...], progress: bool | None
    ) -> None:
        self._src_path = src_path
        self._tgt_path = tgt_path
        self._sides = sides
        self._progress = progress

    def __iter__(self) -> Iterator[str]:
        use_src = "src" in self._sides
        use_tgt = "tgt" in self._sides
        sides = "+".join(self._sides)
        with _progress(
            description=f"reading train ({sides}) for the tokenizer", enabled=self._progress
        ) as bar:
            for src_chunk, tgt_chunk in iter_parallel_chunks(self._src_path, self._tgt_path):
                for src, tgt in zip(src_chunk, tgt_chunk, strict=True):
                    if src.strip() and tgt.strip():
                        if use_src:
                            yield src
                        if use_tgt:
                            yield tgt
                bar.update(len(src_chunk))


def _train_tokenizers(
    *, train_files: tuple[Path, Path], settings: TokenizerSettings, progress: bool | None
) -> Tokenizers:
    src_path, tgt_path = train_files

    def train(sides: tuple[str, ...]) -> SentencePieceTokenizer:
        logger.info(
            "training a %s tokenizer (%s) on %s",
            settings.model_type,
            "+".join(sides),
            src_path.parent,
        )
        return SentencePieceTokenizer.train(
            _TrainingSentences(
                src_path=src_path, tgt_path=tgt_path, sides=sides, progress=progress
            ),
            model_type=settings.model_type,
            vocab_size=settings.vocab_size,
            character_coverage=settings.character_coverage,
            seed=settings.seed,
            max_sentences=settings.max_training_sentences,
        )

    if settings.joint:
        shared = train(("src", "tgt"))
        return Tokenizers(src=shared, tgt=shared, joint=True)
    return Tokenizers(src=train(("src",)), tgt=train(("tgt",)), joint=False)


def token_dtype(vocab_size: int) -> type[np.integer]:
    """Smallest token dtype used on disk for a vocabulary size."""
    return np.uint16 if vocab_size < 65535 else np.int32


def _encode_split(
    *,
    split: str,
    files: tuple[Path, Path],
    tokenizers: Tokenizers,
    filter: FilterSettings | None,
    directory: Path,
    progress: bool | None,
) -> dict[str, Any]:
    """Encodes one split into `<directory>/<split>.{src,tgt}.*.npy`; returns its statistics."""
    dtypes = {
        "src": token_dtype(tokenizers.src.vocab_size),
        "tgt": token_dtype(tokenizers.tgt.vocab_size),
    }
    writers = {
        side: TokenArrayWriter(prefix=directory / f"{split}.{side}", dtype=dtype)
        for side, dtype in dtypes.items()
    }
    read = 0
    dropped = dict.fromkeys(DROP_REASONS, 0)
    totals = {"src": 0, "tgt": 0}
    unknown = {"src": 0, "tgt": 0}
    empty_kept = 0
    try:
        with _progress(description=f"encoding {split}", enabled=progress) as bar:
            for src_chunk, tgt_chunk in iter_parallel_chunks(
                *files, chunk_lines=ENCODE_CHUNK_LINES
            ):
                count = len(src_chunk)
                read += count
                encoded = {
                    "src": tokenizers.src.encode(src_chunk),
                    "tgt": tokenizers.tgt.encode(tgt_chunk),
                }
                lengths = {
                    side: np.fromiter(map(len, ids), dtype=np.int64, count=count)
                    for side, ids in encoded.items()
                }
                flat = {
                    side: np.fromiter(
                        chain.from_iterable(encoded[side]),
                        dtype=dtypes[side],
                        count=int(lengths[side].sum()),
                    )
                    for side in encoded
                }
                del encoded
                if filter is not None:
                    keep = _filter_chunk(lengths["src"], lengths["tgt"], filter, dropped)
                    if not keep.all():
                        for side in flat:
                            flat[side] = flat[side][np.repeat(keep, lengths[side])]
                            lengths[side] = lengths[side][keep]
                else:
                    empty_kept += int(((lengths["src"] == 0) | (lengths["tgt"] == 0)).sum())
                for side, writer in writers.items():
                    writer.append(flat[side], lengths[side])
                    totals[side] += len(flat[side])
                    unknown[side] += int(np.count_nonzero(flat[side] == UNK_ID))
                bar.update(count)
        for writer in writers.values():
            writer.close()
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    kept = writers["src"].sentences
    stats: dict[str, Any] = {
        "src_file": str(files[0]),
        "tgt_file": str(files[1]),
        "filtered": filter is not None,
        "pairs_read": read,
        "pairs_kept": kept,
        "dropped": dropped,
        "src_tokens": totals["src"],
        "tgt_tokens": totals["tgt"],
        "src_mean_pieces": totals["src"] / kept if kept else 0.0,
        "tgt_mean_pieces": totals["tgt"] / kept if kept else 0.0,
        "src_unknown_pieces": unknown["src"],
        "tgt_unknown_pieces": unknown["tgt"],
    }
    if filter is None:
        stats["empty_pairs_kept"] = empty_kept
    return stats


def _filter_chunk(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    settings: FilterSettings,
    dropped: dict[str, int],
) -> np.ndarray:
    """Returns the mask of pairs to keep; adds the dropped ones to `dropped` by first reason."""
    empty = (src_lengths == 0) | (tgt_lengths == 0)
    remaining = ~empty
    too_long = np.zeros_like(empty)
    if settings.max_length is not None:
        too_long = remaining & (
            (src_lengths > settings.max_length) | (tgt_lengths > settings.max_length)
        )
        remaining &= ~too_long
    bad_ratio = np.zeros_like(empty)
    if settings.max_length_ratio is not None:
        longer = np.maximum(src_lengths, tgt_lengths)
        shorter = np.minimum(src_lengths, tgt_lengths)
        bad_ratio = remaining & (longer > settings.max_length_ratio * shorter)
        remaining &= ~bad_ratio
    dropped["empty"] += int(empty.sum())
    dropped["too_long"] += int(too_long.sum())
    dropped["length_ratio"] += int(bad_ratio.sum())
    return remaining


def _build(
    *,
    directory: Path,
    files: Mapping[str, tuple[Path, Path]],
    tokenizer: TokenizerSettings,
    filter: FilterSettings,
    progress: bool | None,
) -> dict[str, Any]:
    """Builds a complete cache in `directory`; returns the summary (also written there)."""
    for split, (src_path, tgt_path) in files.items():
        if split != TRAIN_SPLIT:
            check_parallel(src_path, tgt_path)
    tokenizers = _train_tokenizers(
        train_files=files[TRAIN_SPLIT], settings=tokenizer, progress=progress
    )
    if tokenizers.joint:
        tokenizers.src.save(directory / JOINT_MODEL_FILE)
    else:
        tokenizers.src.save(directory / SIDE_MODEL_FILES["src"])
        tokenizers.tgt.save(directory / SIDE_MODEL_FILES["tgt"])
    splits = {}
    # Train first, the other splits in the caller's order.
    for split in sorted(files, key=lambda name: name != TRAIN_SPLIT):
        splits[split] = _encode_split(
            split=split,
            files=files[split],
            tokenizers=tokenizers,
            filter=filter if split == TRAIN_SPLIT else None,
            directory=directory,
            progress=progress,
        )
        if split == TRAIN_SPLIT and tokenizers.joint and tokenizer.prune_target_vocabulary:
            tokenizers = _prune_target_vocabulary(tokenizers, directory)
    if splits[TRAIN_SPLIT]["pairs_kept"] == 0:
        raise DataError(
            f"no training pairs left after filtering {files[TRAIN_SPLIT][0]} / {files[TRAIN_SPLIT][1]}"
        )
    return {
        "format_version": FORMAT_VERSION,
        "tokenizer": dataclasses.asdict(tokenizer),
        "filter": dataclasses.asdict(filter),
        "joint": tokenizers.joint,
        "vocab_size": {"src": tokenizers.src.vocab_size, "tgt": tokenizers.tgt.vocab_size},
        "splits": splits,
    }


def _prune_target_vocabulary(tokenizers: Tokenizers, directory: Path) -> Tokenizers:
    """Keep only the pieces of the training targets on the target side; remap train.tgt.

    Runs after train is encoded with the full model and before the other splits are, which
    are then encoded with the subset (a piece never seen in training targets becomes UNK).
    """
    tokens_path = Path(f"{directory / TRAIN_SPLIT}.tgt.tokens.npy")
    tokens = np.load(tokens_path, mmap_mode="r+")
    chunk = 1 << 24
    seen = np.zeros(tokenizers.tgt.vocab_size, dtype=bool)
    for start in range(0, len(tokens), chunk):
        seen[tokens[start : start + chunk]] = True
    subset = SubsetTokenizer(base=tokenizers.tgt, kept_ids=np.flatnonzero(seen))
    for start in range(0, len(tokens), chunk):  # in place, chunk by chunk: no full copy
        tokens[start : start + chunk] = subset.to_compact[tokens[start : start + chunk]]
    tokens.flush()
    del tokens
    np.save(directory / TARGET_VOCABULARY_FILE, subset.kept_ids)
    logger.info("target vocabulary: %d of %d pieces occur in the training targets",
                subset.vocab_size, tokenizers.tgt.vocab_size)
    return Tokenizers(src=tokenizers.src, tgt=subset, joint=True)


def _load(
    directory: Path, summary: dict[str, Any]
) -> tuple[Tokenizers, dict[str, ParallelDataset]]:
    if summary.get("joint"):
        shared = SentencePieceTokenizer.load(directory / JOINT_MODEL_FILE)
        target: SentencePieceTokenizer | SubsetTokenizer = shared
        if (directory / TARGET_VOCABULARY_FILE).is_file():
            target = SubsetTokenizer(
                base=shared, kept_ids=np.load(directory / TARGET_VOCABULARY_FILE)
            )
        tokenizers = Tokenizers(src=shared, tgt=target, joint=True)
    else:
        tokenizers = Tokenizers(
            src=SentencePieceTokenizer.load(directory / SIDE_MODEL_FILES["src"]),
            tgt=SentencePieceTokenizer.load(directory / SIDE_MODEL_FILES["tgt"]),
            joint=False,
        )
    splits = {split: ParallelDataset.load(directory / split) for split in summary["splits"]}
    return tokenizers, splits


def _remove_stale_temporaries(cache_root: Path) -> None:
    """Deletes build directories left by crashed runs (old enough not to be in progress)."""
    now = time.time()
    for entry in cache_root.glob(f"{_TEMPORARY_PREFIX}*"):
        try:
            if entry.is_dir() and now - entry.stat().st_mtime > _STALE_TEMPORARY_SECONDS:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            continue


def prepare_data(
    *,
    files: Mapping[str, tuple[Path, Path]],
    tokenizer: TokenizerSettings,
    filter: FilterSettings,
    cache_dir: Path,
    languages: tuple[str, str] | None = None,
    progress: bool | None = None,
) -> PreparedData:
    """Trains the tokenizer(s) and encodes all splits, or reuses the cache of a previous run.

    Args:
        files: Split name -> (source file, target file); must contain "train". Plain or gzip
            UTF-8 text, one sentence a line.
        tokenizer: Tokenizer settings.
        filter: Filter settings for the training split (other splits are never filtered).
        cache_dir: Root of the caches; this run's lives in `cache_dir/<key>/`.
        languages: (source, target) names, for the summary only.
        progress: Show progress bars on stderr (None: only when stderr is a terminal).

    Returns:
        The prepared data.

    Raises:
        DataError: On unusable data (missing file, different line counts, invalid UTF-8,
            nothing left to train on, ...). No cache directory is left behind then.
    """
    started = time.perf_counter()
    files = {split: (Path(src), Path(tgt)) for split, (src, tgt) in files.items()}
    if TRAIN_SPLIT not in files:
        raise DataError(f"no {TRAIN_SPLIT!r} split among {sorted(files)}")
    cache_root = Path(cache_dir).expanduser()
    try:
        cache_root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataError(
            f"cannot create cache directory {cache_root}: {error.strerror or error}"
        ) from None
    hashes = _FileHashCache(path=cache_root / FILE_HASHES_FILE)
    digests = {
        split: (hashes.digest(src), hashes.digest(tgt)) for split, (src, tgt) in files.items()
    }
    hashes.save()
    key = _cache_key(digests, tokenizer, filter)
    directory = cache_root / key

    summary = _read_summary(directory)
    cache_hit = summary is not None
    if summary is not None:
        try:
            tokenizers, splits = _load(directory, summary)
        except (OSError, ValueError, KeyError) as error:
            logger.warning("cache %s is unreadable (%s): rebuilding it", directory, error)
            _discard(directory)
            summary, cache_hit = None, False
    if summary is None:
        summary = _build_into_place(
            directory=directory,
            files=files,
            tokenizer=tokenizer,
            filter=filter,
            progress=progress,
            started=started,
        )
        tokenizers, splits = _load(directory, summary)

    summary = dict(summary)
    summary["cache_hit"] = cache_hit
    summary["cache_dir"] = str(directory)
    summary["seconds"] = time.perf_counter() - started
    summary["languages"] = list(languages) if languages is not None else None
    for split, (src, tgt) in files.items():
        summary["splits"][split] = {
            **summary["splits"][split],
            "src_file": str(src),
            "tgt_file": str(tgt),
        }
    return PreparedData(
        tokenizers=tokenizers,
        splits=splits,
        raw_files=files,
        summary=summary,
        cache_hit=cache_hit,
        cache_dir=directory,
        languages=languages,
    )


def _read_summary(directory: Path) -> dict[str, Any] | None:
    try:
        summary = json.loads((directory / SUMMARY_FILE).read_text("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        logger.warning("cache %s has an unreadable summary (%s): rebuilding it", directory, error)
        _discard(directory)
        return None
    if summary.get("format_version") != FORMAT_VERSION:
        _discard(directory)
        return None
    return summary


def _discard(directory: Path) -> None:
    """Moves a broken cache out of the way (renaming first, so the key is free at once)."""
    trash = directory.with_name(f"{_TEMPORARY_PREFIX}{directory.name}-broken-{os.getpid()}")
    try:
        os.replace(directory, trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def _build_into_place(
    *,
    directory: Path,
    files: Mapping[str, tuple[Path, Path]],
    tokenizer: TokenizerSettings,
    filter: FilterSettings,
    progress: bool | None,
    started: float,
) -> dict[str, Any]:
    cache_root = directory.parent
    _remove_stale_temporaries(cache_root)
    temporary = Path(
        tempfile.mkdtemp(prefix=f"{_TEMPORARY_PREFIX}{directory.name}-", dir=cache_root)
    )
    try:
        summary = _build(
            directory=temporary, files=files, tokenizer=tokenizer, filter=filter, progress=progress
        )
        summary["build_seconds"] = time.perf_counter() - started
        # The summary is written last: its presence marks a complete cache.
        (temporary / SUMMARY_FILE).write_text(json.dumps(summary, indent=1), encoding="utf-8")
        apply_default_permissions(temporary, directory=True)
        try:
            os.rename(temporary, directory)
        except OSError:
            if not (directory / SUMMARY_FILE).is_file():
                raise
            # Another process (e.g. another rank) finished the same cache first: use theirs.
            logger.info("cache %s was built concurrently; using that one", directory)
            stored = _read_summary(directory)
            if stored is None:
                raise
            summary = stored
    finally:
        if temporary.exists():
            shutil.rmtree(temporary, ignore_errors=True)
    logger.info("data cache written to %s", directory)
    return summary


def prepare_data_from_config(
    *,
    data: Mapping[str, Any],
    tokenizer: Mapping[str, Any],
    cache_dir: str | Path,
    progress: bool | None = None,
) -> PreparedData:
    """Runs the data stage from the `data` and `tokenizer` config nodes (as in train.yaml).

    Args:
        data: The `data` node (see configs/data/*.yaml).
        tokenizer: The `tokenizer` node (see configs/tokenizer/*.yaml).
        cache_dir: `paths.cache_dir`.
        progress: Show progress bars (None: only when stderr is a terminal).

    Returns:
        The prepared data.

    Raises:
        DataError: On any data or data-configuration problem.
    """
    tokenizer_settings = TokenizerSettings.from_config(tokenizer)
    filter_settings = FilterSettings.from_config(_get(data, "filter", "data", None))
    files = corpus_files_from_config(data)
    languages = (
        str(_get(data, "src_lang", "data", "src")),
        str(_get(data, "tgt_lang", "data", "tgt")),
    )
    return prepare_data(
        files=files,
        tokenizer=tokenizer_settings,
        filter=filter_settings,
        cache_dir=Path(str(cache_dir)),
        languages=languages,
        progress=progress,
    )


def prepare_from_config(config: Mapping[str, Any], *, progress: bool | None = None) -> PreparedData:
    """Runs the data stage from a whole config (train.yaml or prepare_data.yaml).

    Args:
        config: The root config, with `data`, `tokenizer` and `paths.cache_dir`.
        progress: Show progress bars (None: only when stderr is a terminal).

    Returns:
        The prepared data.

    Raises:
        DataError: On any data or data-configuration problem.
    """
    return prepare_data_from_config(
        data=_get(config, "data", "config"),
        tokenizer=_get(config, "tokenizer", "config"),
        cache_dir=_get(_get(config, "paths", "config"), "cache_dir", "paths"),
        progress=progress,
    )


def _format_count(value: int) -> str:
    return f"{value:,}"


def format_summary(summary: Mapping[str, Any]) -> str:
    """Renders a `PreparedData.summary` as a table (one line per split)."""
    languages = summary.get("languages")
    pair = f"{languages[0]} -> {languages[1]}" if languages else "source -> target"
    if summary.get("cache_hit"):
        status = f"cache hit, loaded in {summary['seconds']:.2f} s (built in {summary.get('build_seconds', 0.0):.1f} s)"
    else:
        status = f"built in {summary['seconds']:.1f} s"
    header = (
        "split",
        "pairs read",
        "kept",
        "dropped",
        "empty",
        "too long",
        "ratio",
        "src mean",
        "tgt mean",
    )
    rows = [header]
    for split, stats in summary["splits"].items():
        if stats["filtered"]:
            dropped = stats["dropped"]
            drop_cells = (
                _format_count(sum(dropped.values())),
                _format_count(dropped["empty"]),
                _format_count(dropped["too_long"]),
                _format_count(dropped["length_ratio"]),
            )
        else:
            drop_cells = ("not filtered", "", "", "")
        rows.append(
            (
                split,
                _format_count(stats["pairs_read"]),
                _format_count(stats["pairs_kept"]),
                *drop_cells,
                f"{stats['src_mean_pieces']:.1f}",
                f"{stats['tgt_mean_pieces']:.1f}",
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = [f"Data summary: {pair}, {status}", f"  cache: {summary['cache_dir']}"]
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  " + "  ".join(cells).rstrip())
    tokenizer = summary["tokenizer"]
    vocab = summary["vocab_size"]
    if summary["joint"]:
        vocabulary = f"joint {tokenizer['model_type']}, {vocab['src']:,} pieces"
        if vocab["src"] < tokenizer["vocab_size"]:
            vocabulary += f" (asked for {tokenizer['vocab_size']:,})"
        if vocab["tgt"] != vocab["src"]:
            vocabulary += f", of which the target side uses {vocab['tgt']:,}"
    else:
        vocabulary = (
            f"{tokenizer['model_type']}, source {vocab['src']:,} / target {vocab['tgt']:,} pieces"
        )
        if min(vocab["src"], vocab["tgt"]) < tokenizer["vocab_size"]:
            vocabulary += f" (asked for {tokenizer['vocab_size']:,})"
    lines.append(f"  vocabulary: {vocabulary}; src/tgt mean: pieces per kept sentence, no bos/eos")
    return "\n".join(lines)
