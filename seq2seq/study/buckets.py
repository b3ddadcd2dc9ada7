"""Where each mechanism wins: BLEU and chrF by source-sentence length.

See docs/compare.md, "What `compare.py` does" ("By source length"). A sentence's length is the
number of whitespace-separated words of its raw source (:data:`LENGTH_BUCKETS`); the intervals
are :func:`seq2seq.metrics.corpus_scores_with_intervals`'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from seq2seq.metrics import corpus_scores_with_intervals
from seq2seq.study import markdown

# (first, last) words of a bucket; None: no upper bound.
LENGTH_BUCKETS: tuple[tuple[int, int | None], ...] = ((1, 9), (10, 14), (15, 19), (20, None))


def bucket_label(bounds: tuple[int, int | None]) -> str:
    first, last = bounds
    return f"{first}+" if last is None else f"{first}-{last}"


def length_bucket(sentence: str) -> str | None:
    """The bucket of a source sentence by its words; None for an empty one."""
    words = len(sentence.split())
    for first, last in LENGTH_BUCKETS:
        if words >= first and (last is None or words <= last):
            return bucket_label((first, last))
    return None


def bucket_scores(groups: Sequence[tuple[str, Sequence[Sequence[str]]]], sources: Sequence[str],
                  references: Sequence[str], *, resamples: int = 1000) -> list[dict[str, Any]]:
    """Each group's BLEU and chrF per length bucket: one ``{"group", "buckets"}`` per group of
    ``groups`` (``(label, outputs)``, one list of hypotheses per run, each aligned with the
    split's raw ``sources``); ``buckets`` maps each bucket's label to its ``sentences`` and the
    scores of :func:`corpus_scores_with_intervals` (absent when the bucket has no sentence)."""
    members: dict[str, list[int]] = {bucket_label(b): [] for b in LENGTH_BUCKETS}
    for index, sentence in enumerate(sources):
        label = length_bucket(sentence)
        if label is not None:
            members[label].append(index)
    rows = []
    for name, outputs in groups:
        buckets = {}
        for label, indices in members.items():
            if not indices:
                continue
            hypotheses = [run[i] for run in outputs for i in indices]
            pooled_references = [references[i] for _ in outputs for i in indices]
            buckets[label] = {"sentences": len(indices), **corpus_scores_with_intervals(
                hypotheses, pooled_references, resamples=resamples)}
        rows.append({"group": name, "buckets": buckets})
    return rows


def markdown_section(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The report's section: one table, a group a row, ``BLEU ± CI / chrF ± CI`` a bucket."""
    labels = [bucket_label(b) for b in LENGTH_BUCKETS]
    present = [label for label in labels if any(label in row["buckets"] for row in rows)]
    if not present:
        return []
    counts = {label: next(row["buckets"][label]["sentences"] for row in rows
                          if label in row["buckets"]) for label in present}
    header = ["group", *(f"{label} words ({counts[label]} sentences)" for label in present)]
    rows_cells = []
    for row in rows:
        cells = [row["group"]]
        for label in present:
            score = row["buckets"].get(label)
            cells.append("-" if score is None else
                         f"{score['bleu']:.2f} ± {score['bleu_ci']:.2f} / "
                         f"{score['chrf']:.2f} ± {score['chrf_ci']:.2f}")
        rows_cells.append(cells)
    return markdown.section(
        "By source length",
        "BLEU ± 95% interval / chrF ± 95% interval of each group's outputs pooled over its "
        "seeds, by the source sentence's words (sacreBLEU's bootstrap over the bucket's "
        "sentences: how sure the sentences make the score, not how much a seed moves it).",
        header, rows_cells)
