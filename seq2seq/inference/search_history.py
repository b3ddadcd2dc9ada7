"""The history of a batched search whose finished sentences leave the batch.

A search records, at each step, one row per sentence still decoding at that step (``N_t`` of
the batch's ``B``; the rest have left the batch, see :mod:`seq2seq.inference.search`).
:func:`full_history` scatters those records into full-batch ``(T, B, ...)`` tensors, with a
fill value where a sentence had left, in one ``index_copy`` per tensor at the end of the
search; :func:`collect_hypotheses` then backtracks the finished beam-search hypotheses.
"""

from __future__ import annotations

import torch
from torch import Tensor


def history_index(segments: list[tuple[int, Tensor]], steps: int, batch_size: int) -> Tensor:
    """Where each row of the concatenated per-step history goes in a flat (T * B) history.

    ``segments`` lists, from each pruning on, (first step, the sentences then decoded, (N,)).
    """
    ends = [start for start, _ in segments[1:]] + [steps]
    parts = []
    for (start, sentences), end in zip(segments, ends, strict=True):
        step_rows = torch.arange(start, end, device=sentences.device) * batch_size  # (T_seg,)
        parts.append((step_rows.unsqueeze(1) + sentences).view(-1))  # (T_seg * N,)
    return torch.cat(parts)


def full_history(per_step: list[Tensor], index: Tensor, batch_size: int, fill) -> Tensor:
    """The history of the whole batch, ``fill`` where a sentence had left it.

    Shape:
        - per_step: each (N_t, *), the sentences decoded at step t
        - index: from :func:`history_index`
        - output: (T, B, *)
    """
    values = torch.cat(per_step)  # (sum of N_t, *)
    history = values.new_full((len(per_step) * batch_size, *values.shape[1:]), fill)
    history.index_copy_(0, index, values)
    return history.view(len(per_step), batch_size, *values.shape[1:])


def collect_hypotheses(
    *,
    src_lengths: Tensor,
    nbest: int,
    history_tokens: Tensor,
    history_parents: Tensor,
    history_weights: Tensor | None,
    finals_mask: Tensor,
    finals_scores: Tensor,
    finals_parents: Tensor,
) -> list[list[tuple[list[int], float, Tensor | None]]]:
    """Pick each sentence's ``nbest`` finished hypotheses and backtrack their tokens.

    Returns:
        Per sentence, best first, ``(tokens, score, attention)`` of each hypothesis (the
        fields of :class:`~seq2seq.inference.search.Hypothesis`, built by the caller).

    Shape:
        - history_tokens, history_parents, finals_*: (T, B, K) on the CPU
        - history_weights: (T, B, K, S) on the CPU, or None
    """
    batch_size = finals_mask.size(1)
    tokens_array = history_tokens.numpy()
    parents_array = history_parents.numpy()
    results = []
    for sentence in range(batch_size):
        steps, slots = finals_mask[:, sentence].nonzero(as_tuple=True)  # finished, (step, rank)
        scores = finals_scores[steps, sentence, slots]
        # Stable sort: equal scores keep the earlier (shorter) hypothesis first.
        order = torch.sort(scores, descending=True, stable=True).indices[:nbest]
        source_len = int(src_lengths[sentence])
        hypotheses = []
        for position in order.tolist():
            end_step = int(steps[position])
            slot = int(finals_parents[end_step, sentence, slots[position]])
            # Walk back from the slot the EOS extends: step t's token sits in slot `slot`.
            tokens, rows = [], []
            if history_weights is not None:
                rows.append(history_weights[end_step, sentence, slot, :source_len])
            for step in range(end_step - 1, -1, -1):
                tokens.append(int(tokens_array[step, sentence, slot]))
                slot = int(parents_array[step, sentence, slot])
                if history_weights is not None:
                    rows.append(history_weights[step, sentence, slot, :source_len])
            tokens.reverse()
            attention = torch.stack(rows[::-1]) if history_weights is not None else None
            hypotheses.append((tokens, float(scores[position]), attention))
        results.append(hypotheses)
    return results
