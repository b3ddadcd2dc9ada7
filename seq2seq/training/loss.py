"""The training objective: label-smoothed cross-entropy over the target tokens."""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.data.vocab import PAD_ID
from seq2seq.ops.smoothed_cross_entropy import smoothed_cross_entropy

# (logits (N, V), targets (N,), smoothing) -> per-token loss and NLL, (N,) each
Criterion = Callable[[Tensor, Tensor, float], tuple[Tensor, Tensor]]


def label_smoothed_formula(logits: Tensor, targets: Tensor, smoothing: float
                           ) -> tuple[Tensor, Tensor]:
    """The loss as autograd writes it: ``(1 - eps) * -log p_y + eps * mean_v(-log p_v)`` and
    ``-log p_y`` per token, in float32. Training runs the same values through
    :func:`~seq2seq.ops.smoothed_cross_entropy.smoothed_cross_entropy`, a block of rows at a
    time; this is the plain version benchmarks and tests compare it with."""
    log_probs = F.log_softmax(logits.float(), dim=-1)  # (N, V)
    nll = -log_probs.gather(1, targets.unsqueeze(1)).squeeze(1)  # (N,)
    smooth = -log_probs.mean(dim=-1)  # (N,) cross-entropy with the uniform distribution
    return (1 - smoothing) * nll + smoothing * smooth, nll.detach()


class SequenceLoss(nn.Module):
    """Wraps a :class:`Seq2Seq` model and returns summed losses for a batch.

    The decoder's features are gathered at the non-padding target positions first, so the
    output projection and the loss run as one large matrix product over just the real tokens.
    Wrapping the whole objective (rather than the model) is what DistributedDataParallel sees,
    so the output layer's gradients are synchronised like every other parameter's.

    Shape:
        - src: (B, S), src_lengths: (B,), tgt_in: (B, T), tgt_out: (B, T)
        - output: (loss_sum, nll_sum), two scalars summed over the target tokens
    """

    def __init__(self, model: nn.Module, *, label_smoothing: float = 0.0,
                 criterion: Criterion = smoothed_cross_entropy) -> None:
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing
        self.criterion = criterion

    def forward(
        self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_out: Tensor
    ) -> tuple[Tensor, Tensor]:
        features, _ = self.model(src, src_lengths, tgt_in, need_weights=False)  # (B, T, D)
        real = tgt_out != PAD_ID  # (B, T)
        logits = self.model.project(features[real])  # (N, V)
        loss, nll = self.criterion(logits, tgt_out[real], self.label_smoothing)  # (N,)
        return loss.sum(), nll.sum().detach()
