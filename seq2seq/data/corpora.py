"""The training corpora of a run: `data.train` read as one or several weighted, tagged corpora,
and checked (files, line counts, weights, tags) before anything is written.

`data.train` is one mapping ``{src, tgt}`` (the original form) or a list of them, each with the
optional keys docs/your-data.md#several-corpora describes.
"""

from __future__ import annotations

import contextlib
import math
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from seq2seq.data.cache import FILE_HASHES_FILE
from seq2seq.data.hashing import FileHashCache
from seq2seq.data.settings import MISSING, get_setting
from seq2seq.data.text_files import DataError, line_count_error, open_binary
from seq2seq.data.vocab import BOS_PIECE, EOS_PIECE, PAD_PIECE, UNK_PIECE

CORPUS_KEYS = ("src", "tgt", "weight", "tag", "name")
# A tag is one piece: no whitespace (sentencepiece would split it there), no "▁" (its own
# whitespace mark), short, and none of the special pieces.
_TAG = re.compile(r"[^\s\u2581]{1,32}")
_SPECIAL_PIECES = (PAD_PIECE, UNK_PIECE, BOS_PIECE, EOS_PIECE)
_COUNT_BLOCK = 1 << 20


@dataclass(frozen=True, kw_only=True)
class TrainCorpus:
    """One training corpus.

    Attributes:
        src: Source file (plain or gzip UTF-8, one sentence a line).
        tgt: Target file, line i translating line i of `src`.
        weight: Its share of the pairs drawn is weight / the sum of all weights.
        tag: Prepended to each of its source sentences as one piece (None: no tag).
        name: How the logs call it.
    """

    src: Path
    tgt: Path
    weight: float = 1.0
    tag: str | None = None
    name: str = "train"

    @property
    def files(self) -> tuple[Path, Path]:
        return self.src, self.tgt


def is_plain(corpora: Sequence[TrainCorpus]) -> bool:
    """One corpus without a tag: prepared, cached and batched exactly as the original
    `data.train: {src, tgt}` (its weight then means nothing)."""
    return len(corpora) == 1 and corpora[0].tag is None


def corpus_tags(corpora: Sequence[TrainCorpus]) -> list[str]:
    """The distinct tags, in order of first use (the tokenizer's user-defined pieces)."""
    return list(dict.fromkeys(corpus.tag for corpus in corpora if corpus.tag is not None))


def train_corpora_from_config(data_cfg: Mapping[str, Any]) -> list[TrainCorpus] | None:
    """The corpora of `data.train` for kind "files"; None for other kinds (Multi30k).

    Raises:
        DataError: On an empty list, an entry that is no {src, tgt} mapping, an unknown key,
            a non-positive weight, a tag that is not one token-like string, a name used twice,
            a file that does not exist. Files are not read here (see `check_train_corpora`).
    """
    if get_setting(data_cfg, "kind", where="data") != "files":
        return None
    node = get_setting(data_cfg, "train", where="data")
    if isinstance(node, Mapping):
        return [_read_corpus(node, where="data.train")]
    if not isinstance(node, Sequence) or isinstance(node, str):
        raise DataError(
            f"data.train must be a mapping {{src, tgt}} or a list of them, got {node!r}"
        )
    if not node:
        raise DataError("data.train is an empty list: give at least one {src, tgt} corpus")
    corpora = [
        _read_corpus(entry, where=f"data.train[{position}]")
        for position, entry in enumerate(node)
    ]
    return _unique_names(corpora, explicit=[_has_name(entry) for entry in node])


def _has_name(entry: Any) -> bool:
    return isinstance(entry, Mapping) and entry.get("name") not in (None, MISSING)


def _read_corpus(entry: Any, *, where: str) -> TrainCorpus:
    if not isinstance(entry, Mapping):
        raise DataError(f"{where} must be a mapping with src and tgt, got {entry!r}")
    unknown = sorted(str(key) for key in entry if key not in CORPUS_KEYS)
    if unknown:
        raise DataError(
            f"{where} has unknown key(s) {', '.join(unknown)}: a corpus takes "
            f"{', '.join(CORPUS_KEYS)}"
        )
    sides = {}
    for side in ("src", "tgt"):
        value = get_setting(entry, side, where=where, default=None)
        if value is None:
            raise DataError(f"{where}.{side} is not set")
        sides[side] = Path(str(value)).expanduser()
        if not sides[side].is_file():
            raise DataError(f"file not found: {sides[side]} ({where}.{side})")
    weight = _weight(get_setting(entry, "weight", where=where, default=1), where=where)
    tag = _tag(get_setting(entry, "tag", where=where, default=None), where=where)
    name = get_setting(entry, "name", where=where, default=None)
    if name is not None and not str(name).strip():
        raise DataError(f"{where}.name must not be empty")
    return TrainCorpus(
        src=sides["src"],
        tgt=sides["tgt"],
        weight=weight,
        tag=tag,
        name=str(name).strip() if name is not None else _default_name(sides["src"]),
    )


def _weight(value: Any, *, where: str) -> float:
    weight = math.nan
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        with contextlib.suppress(ValueError):
            weight = float(value)
    if not math.isfinite(weight) or weight <= 0:
        raise DataError(f"{where}.weight must be a positive number, got {value!r}")
    return weight


def _tag(value: Any, *, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _TAG.fullmatch(value) or value in _SPECIAL_PIECES:
        raise DataError(
            f"{where}.tag must be one token-like string (1 to 32 characters, no spaces, "
            f"not {', '.join(_SPECIAL_PIECES)}), e.g. '<bt>'; got {value!r}"
        )
    return value


def _default_name(src: Path) -> str:
    """`a.de` -> `a`, `bt.de.gz` -> `bt`: the file name without compression and language."""
    name = src.name
    if name.endswith(".gz"):
        name = name[: -len(".gz")]
    stem = name.rsplit(".", 1)[0] if "." in name.lstrip(".") else name
    return stem or name


def _unique_names(corpora: list[TrainCorpus], *, explicit: list[bool]) -> list[TrainCorpus]:
    """Names given twice are an error; derived ones that collide get their position."""
    given = [corpus.name for corpus, named in zip(corpora, explicit, strict=True) if named]
    twice = sorted({name for name in given if given.count(name) > 1})
    if twice:
        raise DataError(f"data.train: corpus name {twice[0]!r} is used twice")
    names = [corpus.name for corpus in corpora]
    renamed = []
    for position, corpus in enumerate(corpora):
        if names.count(corpus.name) > 1 and not explicit[position]:
            corpus = replace(corpus, name=f"{corpus.name}-{position + 1}")
        renamed.append(corpus)
    return renamed


def check_train_corpora(data_cfg: Mapping[str, Any], *, cache_dir: str | Path | None) -> None:
    """Checks `data.train` before a run starts: its form, then every file exists and every
    corpus has as many source lines as target lines.

    Line counts are remembered beside the file hashes in `cache_dir` (by size, mtime and
    inode), so a later run over the same files does not read them again.

    Raises:
        DataError: One line naming the corpus and file at fault.
    """
    corpora = train_corpora_from_config(data_cfg)
    if corpora is None:
        return
    hashes = _line_count_memo(cache_dir)
    for corpus in corpora:
        src_count = line_count(corpus.src, memo=hashes)
        tgt_count = line_count(corpus.tgt, memo=hashes)
        if src_count != tgt_count:
            raise line_count_error(corpus.src, src_count, corpus.tgt, tgt_count)
    if hashes is not None:
        hashes.save()


def _line_count_memo(cache_dir: str | Path | None) -> FileHashCache | None:
    if cache_dir is None:
        return None
    root = Path(str(cache_dir)).expanduser()
    if not root.is_dir():
        return None  # only a speed-up: the data stage creates the folder
    return FileHashCache(path=root / FILE_HASHES_FILE)


def line_count(path: Path, *, memo: FileHashCache | None = None) -> int:
    """Lines of a plain or gzip text file as the corpus readers count them (a last line
    without a line break counts), read in blocks without decoding."""
    if memo is not None:
        return memo.line_count(path, count=line_count)
    lines, last = 0, b"\n"
    with open_binary(Path(path)) as file:
        try:
            while block := file.read(_COUNT_BLOCK):
                lines += block.count(b"\n")
                last = block[-1:]
        except (EOFError, OSError, zlib.error) as error:
            raise DataError(f"cannot read {path}: {error}") from None
    return lines + (last != b"\n")
