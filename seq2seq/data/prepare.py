"""The data stage's pipeline and entry points: raw parallel text in, tokenizers and
memory-mapped encoded splits out, built once per distinct input and reused from the cache.

Pipeline of a build (the cache itself, its key and layout: `seq2seq.data.cache`):
1. every split but train is read once to check it (line counts, UTF-8): cheap, and it fails
   before the expensive steps;
2. the tokenizer(s) are trained on the non-empty training pairs, streamed from disk (or
   given: a fine-tuned run encodes with its parent's);
3. each split is encoded into flat token files (`seq2seq.data.encode`: only training pairs are
   filtered; several training corpora go one after another into the training split).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seq2seq.data.cache import (
    FILE_HASHES_FILE,
    build_into_place,
    cache_key,
    discard,
    load_cache,
    read_summary,
    save_tokenizers,
)
from seq2seq.data.corpora import TrainCorpus, corpus_tags, is_plain, train_corpora_from_config
from seq2seq.data.dataset import ParallelDataset
from seq2seq.data.encode import (
    OUTPUT_ROWS_MULTIPLE,
    SplitSource,
    encode_split,
    prune_target_vocabulary,
)
from seq2seq.data.hashing import FileHashCache
from seq2seq.data.mixing import CorpusMix
from seq2seq.data.settings import FilterSettings, TokenizerSettings, get_setting
from seq2seq.data.sources import TRAIN_SPLIT, corpus_files_from_config
from seq2seq.data.summary import format_summary
from seq2seq.data.text_files import DataError, check_parallel
from seq2seq.data.tokenizer import SubsetTokenizer, Tokenizers
from seq2seq.data.tokenizer_training import train_tokenizers

logger = logging.getLogger(__name__)

@dataclass(kw_only=True)
class PreparedData:
    """The result of `prepare_data`.

    Attributes:
        splits: Split name -> encoded pairs (memory-mapped).
        raw_files: Split name -> (source text file, target text file), e.g. to score BLEU
            against the raw references (valid/test line i answers encoded pair i). Several
            training corpora are not one file pair: "train" is then left out.
        summary: Counts, vocabulary sizes, timings (also in `cache_dir / summary.json`);
            with several corpora or a tag, "corpora": each one's counts, name and weight.
        train_mix: The training corpora as the sampler draws them (None: a single corpus).
    """

    tokenizers: Tokenizers
    splits: dict[str, ParallelDataset]
    raw_files: dict[str, tuple[Path, Path]]
    summary: dict[str, Any]
    cache_hit: bool
    cache_dir: Path
    train_mix: CorpusMix | None = None

    def format_summary(self) -> str:
        """Returns the summary as a printable table."""
        return format_summary(self.summary)


def prepare_data(
    *,
    files: Mapping[str, tuple[Path, Path]],
    tokenizer: TokenizerSettings,
    filter: FilterSettings,
    cache_dir: Path,
    languages: tuple[str, str] | None = None,
    progress: bool | None = None,
    train_corpora: Sequence[TrainCorpus] | None = None,
    tokenizers: Tokenizers | None = None,
) -> PreparedData:
    """Trains the tokenizer(s) and encodes all splits, or reuses the cache of a previous run.

    Args:
        files: Split name -> (source file, target file); must contain "train" unless
            `train_corpora` is given. Plain or gzip UTF-8 text, one sentence a line.
        filter: Filter settings for the training split (other splits are never filtered).
        cache_dir: Root of the caches; this run's lives in `cache_dir/<key>/`.
        languages: (source, target) names, for the summary only.
        progress: Show progress bars on stderr (None: only when stderr is a terminal).
        train_corpora: The training corpora, in place of `files["train"]` (several, or
            weighted and tagged); they are encoded one after another into the "train" split.
        tokenizers: Encode with these (a fine-tuned model's parent's), instead of training
            them; the target vocabulary is then kept as it is, never pruned.

    Raises:
        DataError: On unusable data (missing file, different line counts, invalid UTF-8,
            nothing left to train on, ...). No cache directory is left behind then.
    """
    started = time.perf_counter()
    files = {split: (Path(src), Path(tgt)) for split, (src, tgt) in files.items()}
    if train_corpora is None:
        if TRAIN_SPLIT not in files:
            raise DataError(f"no {TRAIN_SPLIT!r} split among {sorted(files)}")
        train_corpora = [TrainCorpus(src=files[TRAIN_SPLIT][0], tgt=files[TRAIN_SPLIT][1])]
    corpora = list(train_corpora)
    if not corpora:
        raise DataError("no training corpus given")
    # One untagged corpus is the "train" split of old: same cache key, same summary.
    if is_plain(corpora):
        files[TRAIN_SPLIT] = corpora[0].files
    else:
        files.pop(TRAIN_SPLIT, None)
    cache_root = Path(cache_dir).expanduser()
    try:
        cache_root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataError(
            f"cannot create cache directory {cache_root}: {error.strerror or error}"
        ) from None
    hashes = FileHashCache(path=cache_root / FILE_HASHES_FILE)
    digests = {
        split: (hashes.digest(src), hashes.digest(tgt)) for split, (src, tgt) in files.items()
    }
    corpus_digests = None if is_plain(corpora) else [
        (hashes.digest(corpus.src), hashes.digest(corpus.tgt), corpus.tag) for corpus in corpora
    ]
    hashes.save()
    key = cache_key(
        digests=digests, tokenizer=tokenizer, filter=filter, train_corpora=corpus_digests
    )
    if tokenizers is not None:  # given, not trained: the cache belongs to them
        key = hashlib.sha256(f"{key}:{_fingerprint(tokenizers)}".encode()).hexdigest()[:24]
    directory = cache_root / key

    summary = read_summary(directory)
    cache_hit = summary is not None
    if summary is not None:
        try:
            tokenizers, splits = load_cache(directory=directory, summary=summary)
        except (OSError, ValueError, KeyError) as error:
            logger.warning("cache %s is unreadable (%s): rebuilding it", directory, error)
            discard(directory)
            summary, cache_hit = None, False
    if summary is None:

        def build(temporary: Path) -> dict[str, Any]:
            built = _build(
                directory=temporary,
                files=files,
                corpora=corpora,
                tokenizer=tokenizer,
                filter=filter,
                progress=progress,
                given=tokenizers,
            )
            return {**built, "build_seconds": time.perf_counter() - started}

        summary = build_into_place(directory=directory, build=build)
        tokenizers, splits = load_cache(directory=directory, summary=summary)

    # This run's facts: the stored summary is shared by every run with the same inputs.
    summary = dict(summary)
    summary["cache_hit"] = cache_hit
    summary["cache_dir"] = str(directory)
    summary["seconds"] = time.perf_counter() - started
    summary["languages"] = list(languages) if languages is not None else None
    summary["splits"] = {
        split: {**stats, "src_file": str(files[split][0]), "tgt_file": str(files[split][1])}
        if split in files else stats
        for split, stats in summary["splits"].items()
    }
    train_mix = None
    if "corpora" in summary:
        summary["corpora"] = _describe_corpora(corpora, summary["corpora"])
        if len(corpora) > 1:
            train_mix = CorpusMix(
                names=tuple(corpus["name"] for corpus in summary["corpora"]),
                sizes=tuple(corpus["pairs_kept"] for corpus in summary["corpora"]),
                weights=tuple(corpus["weight"] for corpus in summary["corpora"]),
            )
    return PreparedData(
        tokenizers=tokenizers,
        splits=splits,
        raw_files=files,
        summary=summary,
        cache_hit=cache_hit,
        cache_dir=directory,
        train_mix=train_mix,
    )


def _describe_corpora(
    corpora: Sequence[TrainCorpus], cached: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The cached counts of each corpus with this run's names, files and weights (the
    weights are not part of the cache: they act when batches are drawn)."""
    total = sum(corpus.weight for corpus in corpora)
    return [
        {**stats, "name": corpus.name, "src_file": str(corpus.src), "tgt_file": str(corpus.tgt),
         "weight": corpus.weight, "share": corpus.weight / total}
        for corpus, stats in zip(corpora, cached, strict=True)
    ]


def _build(
    *,
    directory: Path,
    files: Mapping[str, tuple[Path, Path]],
    corpora: Sequence[TrainCorpus],
    tokenizer: TokenizerSettings,
    filter: FilterSettings,
    progress: bool | None,
    given: Tokenizers | None = None,
) -> dict[str, Any]:
    """Fills `directory` with the tokenizer(s) (trained, or `given`) and encoded splits;
    returns the summary."""
    for split, (src_path, tgt_path) in files.items():
        if split != TRAIN_SPLIT:
            check_parallel(src_path, tgt_path)
    tokenizers = given if given is not None else train_tokenizers(
        train_files=[corpus.files for corpus in corpora], settings=tokenizer, progress=progress,
        tags=corpus_tags(corpora),
    )
    sources = {
        split: [SplitSource(*pair)] for split, pair in files.items() if split != TRAIN_SPLIT
    }
    sources[TRAIN_SPLIT] = [
        SplitSource(corpus.src, corpus.tgt, _tag_id(tokenizers, corpus.tag)) for corpus in corpora
    ]
    splits = {}
    corpus_stats = []
    # Train first: pruning the target vocabulary needs its encoded targets.
    for split in sorted(sources, key=lambda name: name != TRAIN_SPLIT):
        is_train = split == TRAIN_SPLIT
        splits[split] = encode_split(
            split=split,
            sources=sources[split],
            tokenizers=tokenizers,
            filter=filter if is_train else None,
            directory=directory,
            progress=progress,
        )
        parts = splits[split].pop("parts")
        if is_train:
            for corpus, part in zip(corpora, parts, strict=True):
                if part["pairs_kept"] == 0:
                    raise DataError(
                        f"no training pairs left after filtering {corpus.src} / {corpus.tgt}"
                    )
            if not is_plain(corpora):
                corpus_stats = [{"tag": corpus.tag, **part}
                                for corpus, part in zip(corpora, parts, strict=True)]
        if is_train and tokenizers.joint and tokenizer.prune_target_vocabulary and not given:
            full_size = tokenizers.tgt.vocab_size
            tokenizers, occurring = prune_target_vocabulary(
                tokenizers=tokenizers, directory=directory, split=split
            )
            logger.info("target vocabulary: %d of %d pieces occur in the training targets; the "
                        "output layer has %d rows (a multiple of %d where the vocabulary allows)",
                        occurring, full_size, tokenizers.tgt.vocab_size, OUTPUT_ROWS_MULTIPLE)
    save_tokenizers(directory=directory, tokenizers=tokenizers)
    return {
        "tokenizer": dataclasses.asdict(tokenizer),
        "filter": dataclasses.asdict(filter),
        "joint": tokenizers.joint,
        "vocab_size": {"src": tokenizers.src.vocab_size, "tgt": tokenizers.tgt.vocab_size},
        "splits": splits,
        # Several corpora, or a tagged one: each one's counts, in order.
        **({"corpora": corpus_stats} if corpus_stats else {}),
    }


def _tag_id(tokenizers: Tokenizers, tag: str | None) -> int | None:
    """The source piece of a corpus tag (None for no tag)."""
    if tag is None:
        return None
    ids = tokenizers.src.encode([tag])[0]
    if len(ids) != 1 or tokenizers.src.id_to_piece(ids[0]) != tag:
        raise DataError(f"tag {tag!r} is not one piece of the source vocabulary")
    return ids[0]


def _fingerprint(tokenizers: Tokenizers) -> str:
    """SHA-256 of the model(s) and the kept target pieces: what a cache's encodings depend on."""
    digest = hashlib.sha256(b"joint" if tokenizers.joint else b"separate")
    for side in (tokenizers.src, tokenizers.tgt):
        digest.update(hashlib.sha256(side.to_bytes()).digest())
    if isinstance(tokenizers.tgt, SubsetTokenizer):
        digest.update(tokenizers.tgt.kept_ids.astype("<i8").tobytes())
    return digest.hexdigest()


def prepare_from_config(config: Mapping[str, Any], *, progress: bool | None = None,
                        tokenizers: Tokenizers | None = None) -> PreparedData:
    """Runs the data stage from a whole run config (train.yaml or prepare_data.yaml).

    Args:
        config: The root config as plain nested dicts (`OmegaConf.to_container(cfg,
            resolve=True)`: the library does not depend on OmegaConf) with the `data` and
            `tokenizer` nodes (see seq2seq/configs/data/*.yaml, tokenizer/*.yaml) and
            `paths.cache_dir`; unset ("???") values are reported by name.
        progress, tokenizers: As for `prepare_data`.

    Raises:
        DataError: On any data or data-configuration problem.
    """
    # Every setting is read and checked before the corpus files, which may be downloaded.
    data = get_setting(config, "data", where="config")
    paths = get_setting(config, "paths", where="config")
    cache_dir = Path(str(get_setting(paths, "cache_dir", where="paths")))
    tokenizer = TokenizerSettings.from_config(get_setting(config, "tokenizer", where="config"))
    filter_settings = FilterSettings.from_config(
        get_setting(data, "filter", where="data", default=None))
    return prepare_data(
        files=corpus_files_from_config(data),
        tokenizer=tokenizer,
        filter=filter_settings,
        cache_dir=cache_dir,
        languages=(str(get_setting(data, "src_lang", where="data", default="src")),
                   str(get_setting(data, "tgt_lang", where="data", default="tgt"))),
        train_corpora=train_corpora_from_config(data),
        progress=progress,
        tokenizers=tokenizers,
    )
