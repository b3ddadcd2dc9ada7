"""The history of a batched search whose finished sentences leave the batch.

A search records, at each step, one row per sentence still decoding at that step (``N_t`` of
the batch's ``B``; the rest have left the batch, see :mod:`seq2seq.inference.search_loop`) in a
:class:`SearchHistory`, which keeps it on the device. At the end, :func:`full_history` scatters
those records into full-batch ``(T, B, ...)`` tensors, with a fill value where a sentence had
left, in one ``index_copy`` per tensor, and :meth:`SearchHistory.hypotheses` picks and
backtracks the finished hypotheses of every sentence at once.
"""

from __future__ import annotations

import math

import numpy as np
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


class SearchHistory:
    """What a search decoded at each step, kept on the device until :meth:`hypotheses`.

    Args:
        sentences: (B,) the batch's sentences, all decoded from the first step on.
        attention: whether to keep the attention weights too.
    """

    def __init__(self, sentences: Tensor, *, attention: bool) -> None:
        self.batch_size = sentences.numel()
        self.segments = [(0, sentences)]  # (first step, sentences decoded from then on)
        self.attention = attention
        self.tokens: list[Tensor] = []  # token chosen into each row, each (N, R)
        self.parents: list[Tensor] = []  # the row (of those decoded at that step) it extends
        self.weights: list[Tensor] = []  # attention of each row decoded at that step, (N, R, S)
        # The length-penalised scores of the EOS candidates that became finished hypotheses,
        # (N, K), -inf where none did.
        self.finals_scores: list[Tensor] = []
        self.finals_parents: list[Tensor] = []  # the row they extend, (N, K)

    def record(self, *, tokens: Tensor, parents: Tensor, weights: Tensor | None,
               final_scores: Tensor, final_parents: Tensor) -> None:
        """One step's rows (see the attributes' comments for the shapes)."""
        self.tokens.append(tokens)
        self.parents.append(parents)
        if self.attention:
            self.weights.append(weights)
        self.finals_scores.append(final_scores)
        self.finals_parents.append(final_parents)

    def leave(self, step: int, sentences: Tensor) -> None:
        """From ``step`` on, only ``sentences`` (N',) are decoded."""
        self.segments.append((step, sentences))

    def hypotheses(self, src_lengths: Tensor, nbest: int, *,
                   output_ids: Tensor | None = None) -> list[list[tuple]]:
        """Pick each sentence's ``nbest`` finished hypotheses and backtrack their tokens, all
        sentences' at once, one step at a time (positions in ``output_ids``, a shortlist, made
        target ids).

        Returns:
            Per sentence, best first, ``(tokens, score, attention)`` of each hypothesis (the
            fields of :class:`~seq2seq.inference.search_loop.Hypothesis`, built by the caller).
        """
        index = history_index(self.segments, len(self.tokens), self.batch_size)

        def full(per_step: list[Tensor], fill) -> Tensor:  # (T, B, ...) on the CPU
            return full_history(per_step, index, self.batch_size, fill).cpu()

        finals_scores = full(self.finals_scores, -math.inf)  # (T, B, K)
        steps, batch_size, slots = finals_scores.shape
        # Each sentence's finished hypotheses, best first, in (step, slot) order between equal
        # scores (a stable sort): the earlier, shorter hypothesis first.
        by_sentence = finals_scores.permute(1, 0, 2).reshape(batch_size, steps * slots)
        order = by_sentence.sort(dim=1, descending=True, stable=True).indices[:, :nbest]
        scores = by_sentence.gather(1, order).tolist()  # (B, H)
        counts = (by_sentence > -math.inf).sum(dim=1).clamp(max=nbest).tolist()  # (B,)
        order = order.numpy()
        sentence = np.arange(batch_size)[:, None]  # (B, 1)
        ends = order // slots  # (B, H) the step of each hypothesis' EOS
        # Walk back from the row its EOS extends: step t's token sits in row `row`.
        row = full(self.finals_parents, 0).numpy()[ends, sentence, order % slots]  # (B, H)
        history_tokens, history_parents = full(self.tokens, 0).numpy(), full(self.parents, 0).numpy()
        tokens = np.zeros((steps, *ends.shape), dtype=np.int64)  # (T, B, H)
        rows = np.zeros((steps, *ends.shape), dtype=np.int64)  # (T, B, H) the row read at step t
        for step in range(steps - 1, -1, -1):
            tokens[step] = history_tokens[step, sentence, row]
            row = np.where(ends > step, history_parents[step, sentence, row], row)
            rows[step] = row
        if output_ids is not None:
            tokens = output_ids.cpu().numpy()[tokens]
        weights = None  # (T, B, H, S) each hypothesis' attention rows
        if self.attention:
            weights = full(self.weights, 0.0)[torch.arange(steps).view(-1, 1, 1),
                                             torch.arange(batch_size).view(1, -1, 1),
                                             torch.from_numpy(rows)]
        results = []
        for b in range(batch_size):
            source_len = int(src_lengths[b])
            hypotheses = []
            for h in range(counts[b]):
                end = int(ends[b, h])
                attention = None if weights is None else weights[:end + 1, b, h, :source_len].clone()
                hypotheses.append((tokens[:end, b, h].tolist(), scores[b][h], attention))
            results.append(hypotheses)
        return results
