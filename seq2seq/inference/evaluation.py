"""Translate a test set and score it: the one path behind validation and ``evaluate.py``.

The trainer's validation BLEU and the BLEU ``evaluate.py`` prints both come from
:func:`evaluate_translations`, so they cannot drift apart: the same translation call, the
same detokenization, sacreBLEU with the same settings (:func:`seq2seq.metrics.corpus_scores`)
and the same hypothesis file, one detokenized translation a line, which
``sacrebleu REF -i HYP`` scores to the same number.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seq2seq.atomic import write_text
from seq2seq.data.corpus import DataError, iter_parallel_chunks
from seq2seq.metrics import corpus_scores

SPLITS = ("valid", "test")


@dataclass
class Evaluation:
    """Scores of one test set.

    Attributes:
        hypotheses: the best translation of each source, in input order.
        scores: ``bleu``, ``chrf``, ``bleu_detail``, ``bleu_signature``, ``chrf_signature``.
        generation_seconds: the translation alone (tokenize, search, detokenize).
        attention_entropy: with ``attention_stats=True``, the entropy (nats) of the attention
            distribution of each target step (EOS step and source EOS column included), averaged
            over all steps of all sentences; else None.
        attention_max_weight: with ``attention_stats=True``, the largest attention weight of
            each target step, averaged the same way (1.0: every step looks at one source
            piece; 1/S: uniform); else None.
    """

    hypotheses: list[str]
    scores: dict[str, Any]
    generation_seconds: float
    attention_entropy: float | None = None
    attention_max_weight: float | None = None

    @property
    def sentences_per_second(self) -> float:
        return len(self.hypotheses) / max(self.generation_seconds, 1e-9)


def evaluate_translations(
    translator,
    sources: Sequence[str],
    references: Sequence[str],
    *,
    hypotheses_path: str | Path | None = None,
    attention_stats: bool = False,
) -> Evaluation:
    """Translate ``sources`` with ``translator``, score against ``references``, write hypotheses.

    Args:
        translator: a :class:`~seq2seq.inference.translator.Translator` (its beam size,
            length penalty and precision apply).
        sources: raw source sentences, one per entry.
        references: raw reference sentences, as many as ``sources``.
        hypotheses_path: if given, the hypotheses are written there (atomically), one a line.
        attention_stats: also keep the best hypotheses' attention weights and return their
            mean entropy and mean maximum weight (the translation keeps the weights, which
            makes it a little slower; the hypotheses are the same).

    Raises:
        ValueError: when the counts of sources and references differ.
    """
    if len(sources) != len(references):
        raise ValueError(
            f"{len(sources)} source sentences but {len(references)} references: they must match"
        )
    started = time.perf_counter()
    # The searches copy their results to the CPU, so no GPU work is still queued after this.
    translations = translator.translate(list(sources), return_attention=attention_stats)
    generation_seconds = time.perf_counter() - started
    hypotheses = [n_best[0].text for n_best in translations]
    scores = corpus_scores(hypotheses, references)
    if hypotheses_path is not None:
        write_text(hypotheses_path, "".join(f"{hypothesis}\n" for hypothesis in hypotheses))
    evaluation = Evaluation(
        hypotheses=hypotheses, scores=scores, generation_seconds=generation_seconds
    )
    if attention_stats:
        evaluation.attention_entropy, evaluation.attention_max_weight = attention_statistics(
            [n_best[0].attention for n_best in translations]
        )
    return evaluation


def attention_statistics(attentions: Sequence[Any]) -> tuple[float, float]:
    """Mean entropy (nats) and mean maximum weight over the rows of attention matrices.

    Args:
        attentions: one (T, S) matrix (tensor or array) per sentence, or None for a sentence
            without attention (an empty source); each row is one target step's distribution.

    Returns:
        ``(nan, nan)`` when there is no row at all.
    """
    import numpy as np

    entropy_sum = max_sum = 0.0
    rows = 0
    for weights in attentions:
        if weights is None:
            continue
        if hasattr(weights, "detach"):
            weights = weights.detach().float().cpu().numpy()
        weights = np.asarray(weights, dtype=np.float64).reshape(-1, np.shape(weights)[-1])
        if weights.size == 0:
            continue
        positive = np.where(weights > 0, weights, 1.0)  # 0 * log 0 = 0
        entropy_sum += float(-(weights * np.log(positive)).sum())
        max_sum += float(weights.max(axis=1).sum())
        rows += weights.shape[0]
    if rows == 0:
        return float("nan"), float("nan")
    return entropy_sum / rows, max_sum / rows


def read_parallel(src_path: str | Path, ref_path: str | Path) -> tuple[list[str], list[str]]:
    """All source and reference lines of a pair of files, checked to have equal counts.

    Raises:
        DataError: on a missing file, invalid UTF-8 or different line counts.
    """
    sources: list[str] = []
    references: list[str] = []
    for src_chunk, ref_chunk in iter_parallel_chunks(Path(src_path), Path(ref_path)):
        sources.extend(src_chunk)
        references.extend(ref_chunk)
    return sources, references


def _merged(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


def split_files(
    checkpoint_config: Mapping[str, Any], split: str, overrides: Mapping[str, Any] | None = None
) -> tuple[Path, Path]:
    """The (source, reference) files of a split of a checkpoint's data config.

    Args:
        checkpoint_config: the ``config`` entry of a checkpoint (plain containers).
        split: ``valid`` or ``test``.
        overrides: merged onto the stored ``data`` node first (e.g. another ``dir``).

    Raises:
        DataError: on an unknown split, a config without it, or missing files.
    """
    from seq2seq.data.prepare import corpus_files_from_config

    if split not in SPLITS:
        raise DataError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if "data" not in checkpoint_config:
        raise DataError("the checkpoint stores no data config: score files with src=... ref=...")
    files = corpus_files_from_config(_merged(checkpoint_config["data"], overrides or {}))
    if split not in files:
        raise DataError(
            f"the checkpoint's data config has no {split!r} split: score files with src=... ref=..."
        )
    return files[split]
