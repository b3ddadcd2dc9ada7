"""What the search loop forces at a step: never PAD or BOS, EOS at a sentence's length limit,
the tokens of a forced prefix (:func:`~seq2seq.inference.search_loop.run_search` calls these once a
step; a forced token keeps its own log-probability, so a score stays the model's)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from seq2seq.data.vocab import BOS_ID, EOS_ID, PAD_ID


def next_token_log_probs(logits: Tensor, forced: Tensor | None) -> Tensor:
    """Log-probabilities of the next token, with PAD/BOS forbidden and a token forced where asked
    (set to -inf after the softmax, so the rest keep their own log-probabilities).

    Shape:
        - logits: (N, V)
        - forced: (N,) the token each row must produce, -1 where any may follow; None when no
          row is forced
        - output: (N, V) float32
    """
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
    log_probs[:, PAD_ID] = -math.inf
    log_probs[:, BOS_ID] = -math.inf
    if forced is None:
        return log_probs
    # In place, no (N, V) temporaries: this runs over the whole output layer at every step.
    is_forced = (forced >= 0).unsqueeze(1)  # (N, 1)
    column = forced.clamp(min=0).masked_fill(~is_forced.squeeze(1), PAD_ID).unsqueeze(1)
    kept = log_probs.gather(1, column)  # (N, 1); -inf (PAD's) in a free row
    log_probs.masked_fill_(is_forced, -math.inf)
    return log_probs.scatter_(1, column, kept)


def forced_tokens(step: int, max_lengths: Tensor, first_forced_step: int,
                  prefixes: Tensor | None, sentences: Tensor) -> Tensor | None:
    """Per sentence, the token ``step`` must produce (-1: any), or None when none is forced:
    EOS at the length limit, else a forced prefix's token.

    ``first_forced_step`` is the smallest limit of the batch, known on the host: until then and
    past the prefixes no row is forced and the search skips a masking pass over the whole
    (N, V) output layer.

    Shape:
        - max_lengths, sentences: (N,) the limits and batch rows of the sentences in the batch
        - prefixes: (B, P) each sentence's forced first tokens, -1 after its prefix; or None
        - output: (N,) int64, or None
    """
    forced = None
    if prefixes is not None and step < prefixes.size(1):
        forced = prefixes[sentences, step]  # (N,)
    if step >= first_forced_step:
        free = torch.full_like(max_lengths, -1) if forced is None else forced
        forced = torch.where(max_lengths <= step, EOS_ID, free)
    return forced


def pad_prefixes(prefixes: Sequence[Sequence[int]], device: torch.device | str) -> Tensor | None:
    """Each sentence's forced prefix as one (B, P) tensor, -1 after its end; None when every
    prefix is empty."""
    width = max((len(prefix) for prefix in prefixes), default=0)
    if width == 0:
        return None
    padded = torch.full((len(prefixes), width), -1, dtype=torch.long)
    for row, prefix in enumerate(prefixes):
        padded[row, : len(prefix)] = torch.as_tensor(list(prefix), dtype=torch.long)
    return padded.to(device)
