"""What a search step does with the output layer's logits before ranking candidates.

Shared by greedy and beam search (:mod:`seq2seq.inference.search`): the next token's
log-probabilities with PAD/BOS forbidden, and EOS forced on the rows at their length limit,
skipping that mask while no row can be at its limit.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from seq2seq.data.vocab import BOS_ID, EOS_ID, PAD_ID


def next_token_log_probs(logits: Tensor, force_eos: Tensor | None) -> Tensor:
    """Log-probabilities of the next token, with PAD/BOS forbidden and EOS forced where asked.

    Forbidden tokens get -inf after the softmax: the others keep their log-probabilities.

    Shape:
        - logits: (N, V)
        - force_eos: (N,) bool, True where only EOS may follow; None when no row is forced
        - output: (N, V) float32
    """
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
    log_probs[:, PAD_ID] = -math.inf
    log_probs[:, BOS_ID] = -math.inf
    if force_eos is None:
        return log_probs
    # In place, no (N, V) temporaries: this runs over the whole output layer at every step.
    eos = log_probs[:, EOS_ID].clone()  # (N,)
    log_probs.masked_fill_(force_eos.unsqueeze(1), -math.inf)
    log_probs[:, EOS_ID] = eos
    return log_probs


def forcing_rows(max_lengths: Tensor, step: int, first_forced_step: int) -> Tensor | None:
    """The rows whose length limit forces EOS at ``step``, or None before any can be.

    ``first_forced_step`` is the smallest limit of the batch, known on the host: until then no
    row is forced and the search skips a masking pass over the whole (N, V) output layer,
    without a host sync. Sorted batches of similar lengths rarely reach it at all.

    Shape:
        - max_lengths: (N,) the limits of the sentences still in the batch
        - output: (N,) bool, or None
    """
    return None if step < first_forced_step else max_lengths <= step
