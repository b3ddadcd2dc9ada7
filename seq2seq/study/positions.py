"""Where each mechanism wins along the target: next-piece accuracy by position, teacher-forced.

See docs/compare.md, "What `compare.py` does" ("By target position"). A prediction is right when
its most likely piece is the reference's; a 7-piece reference (EOS counted) has 3, 2 and 2
positions in its thirds. A bootstrap resample draws sentences with every seed's predictions for
them, so, like the length buckets' interval, it says how sure the sentences make the number, not
how much a seed moves it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from seq2seq.precision import autocast
from seq2seq.study import markdown

THIRDS = ("first", "middle", "last")


def position_counts(model, tokenizers, sources: Sequence[str], references: Sequence[str], *,
                    device: torch.device | str = "cpu", autocast_dtype: torch.dtype | None = None,
                    max_source_length: int = 250, batch_size: int = 64) -> np.ndarray:
    """Per sentence and third, the correct predictions and the reference pieces of ``model``
    (set to evaluation mode here) on the aligned raw ``sources`` and ``references``; under
    autocast in ``autocast_dtype`` (None: the model's own), sources cut at
    ``max_source_length`` as the translator cuts them.

    Shape:
        - output: (N, 3, 2) int64, ``[..., 0]`` correct, ``[..., 1]`` pieces, for the thirds.
    """
    from seq2seq.data.batching import collate
    from seq2seq.inference.translator import eval_mode

    if len(sources) != len(references):
        raise ValueError(f"{len(sources)} sources but {len(references)} references")
    src_ids = [np.asarray(ids, dtype=np.int64)[:max_source_length]
               for ids in tokenizers.src.encode(list(sources))]
    tgt_ids = [np.asarray(ids, dtype=np.int64) for ids in tokenizers.tgt.encode(list(references))]
    counts = np.zeros((len(sources), len(THIRDS), 2), dtype=np.int64)
    order = sorted(range(len(sources)), key=lambda i: -src_ids[i].size)  # little padding
    device = torch.device(device)
    with eval_mode(model):
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            batch = collate([(src_ids[i], tgt_ids[i]) for i in rows])  # tgt_out ends in EOS
            with torch.no_grad(), autocast(device.type, autocast_dtype):
                features, _ = model(batch.src.to(device), batch.src_lengths,
                                    batch.tgt_in.to(device), need_weights=False)
                predicted = model.project(features).argmax(-1).cpu()  # (B, T)
            for row, index in enumerate(rows):
                length = tgt_ids[index].size + 1  # this reference's T, EOS counted
                right = (predicted[row, :length] == batch.tgt_out[row, :length]).numpy()  # (T,)
                third = np.arange(length) * len(THIRDS) // length  # (T,) 0, 1 or 2
                counts[index, :, 0] = np.bincount(third, weights=right.astype(np.float64),
                                                  minlength=3)
                counts[index, :, 1] = np.bincount(third, minlength=3)
    return counts


def pooled_accuracy(runs: Sequence[np.ndarray], *, resamples: int = 1000,
                    seed: int = 0) -> dict[str, dict[str, float]]:
    """Accuracy per third of several runs' counts (same sentences), with a 95% bootstrap interval.

    Returns:
        ``{third: {"accuracy": %, "ci": half-width %, "pieces": reference pieces of one run}}``.
    """
    counts = np.sum(np.stack([np.asarray(run) for run in runs]), axis=0)  # (N, 3, 2) pooled
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, counts.shape[0], size=(resamples, counts.shape[0]))  # (R, N)
    resampled = counts[draws].sum(axis=1)  # (R, 3, 2)
    accuracy = 100 * resampled[..., 0] / np.maximum(resampled[..., 1], 1)  # (R, 3)
    low, high = np.percentile(accuracy, [2.5, 97.5], axis=0)  # (3,) each
    total = counts.sum(axis=0)  # (3, 2)
    return {name: {"accuracy": float(100 * total[k, 0] / max(total[k, 1], 1)),
                   "ci": float((high[k] - low[k]) / 2),
                   "pieces": int(total[k, 1] // len(runs))}
            for k, name in enumerate(THIRDS)}


def position_scores(groups: Sequence[tuple[str, Sequence[np.ndarray]]], *,
                    resamples: int = 1000) -> list[dict[str, Any]]:
    """One ``{"group", "thirds"}`` per group (:func:`pooled_accuracy` of its runs' counts)."""
    return [{"group": name, "thirds": pooled_accuracy(runs, resamples=resamples)}
            for name, runs in groups if runs]


def markdown_section(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The report's section: one table, a group a row, ``accuracy ± CI`` a third."""
    if not rows:
        return []
    return markdown.section(
        "By target position",
        "Next-piece accuracy (%) under teacher forcing in the first, middle and last third of "
        "each reference (EOS counted), each group's predictions pooled over its seeds, ± the "
        "95% interval of a bootstrap over sentences (how sure the sentences make the number, "
        "not how much a seed moves it).",
        ["group", *(f"{name} third" for name in THIRDS)],
        ([row["group"]] + [f"{row['thirds'][name]['accuracy']:.2f} ± "
                           f"{row['thirds'][name]['ci']:.2f}" for name in THIRDS]
         for row in rows))
