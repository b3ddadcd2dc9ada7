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
from typing import TYPE_CHECKING, Any, NamedTuple

from seq2seq.atomic import write_text
from seq2seq.console import count_bar
from seq2seq.data.text_files import DataError, iter_parallel_chunks
from seq2seq.metrics import corpus_scores

if TYPE_CHECKING:
    from seq2seq.inference.decode_options import DecodeOptions

SPLITS = ("valid", "test")


@dataclass
class Evaluation:
    """Scores of one test set.

    Attributes:
        hypotheses: the best translation of each source, in input order.
        scores: ``bleu``, ``chrf``, ``bleu_detail``, ``bleu_signature``, ``chrf_signature``.
        generation_seconds: the translation alone (tokenize, search, detokenize).
        attention: with ``attention_stats=True``, what the best hypotheses' attention says
            (:func:`attention_statistics`); else None.
        term_use_rate: the share of the phrases ``constraints`` asked for that
            :func:`term_use` finds; None where they ask for none.
        required_phrases: how many phrases ``constraints`` asked for, all sentences together.
    """

    hypotheses: list[str]
    scores: dict[str, Any]
    generation_seconds: float
    attention: AttentionStatistics | None = None
    term_use_rate: float | None = None
    required_phrases: int = 0

    @property
    def sentences_per_second(self) -> float:
        return len(self.hypotheses) / max(self.generation_seconds, 1e-9)


def evaluate_translations(
    translator,
    sources: Sequence[str],
    references: Sequence[str],
    options: DecodeOptions | None = None,
    *,
    hypotheses_path: str | Path | None = None,
    attention_stats: bool = False,
    progress: bool | None = None,
    prefixes: Sequence[str] | None = None,
    constraints: Sequence[Sequence[str]] | None = None,
) -> Evaluation:
    """Translate ``sources`` with ``translator`` (any
    :class:`~seq2seq.inference.translator.BaseTranslator`), score the best translations against
    ``references``, and write them to ``hypotheses_path`` (atomically, one a line) if given.

    Args:
        attention_stats: also keep the best hypotheses' attention weights for
            :func:`attention_statistics` (the translation is a little slower; the hypotheses
            are the same).
        progress: a bar over the sentences on stderr; None: on a terminal, once the
            decoding has lasted two seconds.
        prefixes, constraints: as the translator's ``translate`` takes them.

    Raises:
        ValueError: when the counts of sources and references differ, or the translator
            refuses a prefix or a phrase.
    """
    if len(sources) != len(references):
        raise ValueError(
            f"{len(sources)} source sentences but {len(references)} references: they must match"
        )
    started = time.perf_counter()
    # The searches copy their results to the CPU, so no GPU work is still queued after this.
    with count_bar(len(sources), description="translating", unit=" sentences",
                   enabled=progress) as bar:
        translations = translator.translate(list(sources), options,
                                            return_attention=attention_stats,
                                            progress=bar.update, prefixes=prefixes,
                                            constraints=constraints)
    generation_seconds = time.perf_counter() - started
    hypotheses = [n_best[0].text for n_best in translations]
    if hypotheses_path is not None:
        write_text(hypotheses_path, "".join(f"{hypothesis}\n" for hypothesis in hypotheses))
    evaluation = Evaluation(hypotheses=hypotheses, scores=corpus_scores(hypotheses, references),
                            generation_seconds=generation_seconds)
    if attention_stats:
        evaluation.attention = attention_statistics([n_best[0].attention
                                                     for n_best in translations])
    if constraints is not None:
        found, evaluation.required_phrases = term_use(hypotheses, constraints)
        evaluation.term_use_rate = (found / evaluation.required_phrases
                                    if evaluation.required_phrases else None)
    return evaluation


def term_use(hypotheses: Sequence[str], constraints: Sequence[Sequence[str]]) -> tuple[int, int]:
    """(phrases found, phrases asked for): a phrase counts as found when it appears as written
    in its sentence's hypothesis. Constrained search writes every phrase's pieces, so a miss is
    a phrase whose detokenized form differs from its text, or an empty source (never
    decoded)."""
    found = sum(phrase in hypothesis
                for hypothesis, phrases in zip(hypotheses, constraints, strict=True)
                for phrase in phrases)
    return found, sum(len(phrases) for phrases in constraints)


# A source piece counts as covered once its attention, summed over the target steps, reaches
# this: half of one step's whole attention.
COVERAGE_THRESHOLD = 0.5


class AttentionStatistics(NamedTuple):
    """What the attention matrices of a test set say, each averaged over its own units (NaN
    where there are none): ``entropy``, the entropy (nats) of each target step's distribution
    (the EOS step and the source EOS column included); ``max_weight``, each step's largest
    weight (1.0: one source piece; 1/S: uniform); ``backward_moves``, the share of pairs of
    consecutive steps (the EOS step left out) whose most-attended piece lies before the
    previous step's (0: monotonic; about 0.5 for a random order); ``coverage``, the share of
    source pieces (EOS left out) whose attention over the steps reaches
    :data:`COVERAGE_THRESHOLD` (1.0: every piece translated by some step)."""

    entropy: float
    max_weight: float
    backward_moves: float
    coverage: float


def attention_statistics(attentions: Sequence[Any]) -> AttentionStatistics:
    """Entropy, sharpness, monotonicity and coverage of attention matrices.

    Args:
        attentions: one (T + 1, S + 1) matrix (tensor or array) per sentence, the last row the
            EOS step and the last column the source's EOS (as the searches return them), or
            None for a sentence without attention (an empty source); each row is one target
            step's distribution.
    """
    import numpy as np

    entropy_sum = max_sum = backward = moves = covered = pieces = 0.0
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
        focus = weights[:-1].argmax(axis=1)  # each step's most-attended piece, EOS step out
        backward += float((np.diff(focus) < 0).sum())
        moves += max(len(focus) - 1, 0)
        totals = weights[:, :-1].sum(axis=0)  # (S,) each piece's attention, EOS column out
        covered += float((totals >= COVERAGE_THRESHOLD).sum())
        pieces += totals.size

    def share(part: float, whole: float) -> float:
        return part / whole if whole else float("nan")

    return AttentionStatistics(entropy=share(entropy_sum, rows), max_weight=share(max_sum, rows),
                               backward_moves=share(backward, moves),
                               coverage=share(covered, pieces))


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
        overrides: merged onto the stored ``data`` node first (e.g. another ``dir``).

    Raises:
        DataError: on an unknown split, a config without it, or missing files.
    """
    from seq2seq.data.sources import corpus_files_from_config

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
