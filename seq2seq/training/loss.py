"""The training objective: label-smoothed cross-entropy over the target tokens."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.data.vocab import PAD_ID


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

    def __init__(self, model: nn.Module, *, label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing

    def forward(
        self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_out: Tensor
    ) -> tuple[Tensor, Tensor]:
        features, _ = self.model(src, src_lengths, tgt_in, need_weights=False)  # (B, T, D)
        real = tgt_out != PAD_ID  # (B, T)
        logits = self.model.project(features[real]).float()  # (N, V)
        targets = tgt_out[real]  # (N,)
        log_probs = F.log_softmax(logits, dim=-1)
        nll = -log_probs.gather(1, targets.unsqueeze(1)).squeeze(1)  # (N,)
        nll_sum = nll.sum()
        if self.label_smoothing > 0:
            smooth = -log_probs.mean(dim=-1)  # (N,) cross-entropy with the uniform distribution
            loss = (1 - self.label_smoothing) * nll + self.label_smoothing * smooth
            return loss.sum(), nll_sum.detach()
        return nll_sum, nll_sum.detach()

