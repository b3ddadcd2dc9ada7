"""The training objective: label-smoothed cross-entropy, checked against its formula by hand.

For each non-padding target token y with predicted distribution p over V pieces:
``loss = (1 - eps) * (-log p_y) + eps * mean_v(-log p_v)``, summed over the batch's tokens;
the NLL (``-log p_y``, summed) comes back beside it, for perplexity.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seq2seq.data.vocab import BOS_ID, EOS_ID, PAD_ID
from seq2seq.training.loss import SequenceLoss

VOCAB = 20


def padded_batch(target_lengths=(5, 2, 3), width: int = 6, seed: int = 0):
    """src (B, S) and teacher-forcing tgt_in/tgt_out (B, width), padded with PAD_ID."""
    generator = torch.Generator().manual_seed(seed)
    batch_size = len(target_lengths)
    src_lengths = torch.tensor([4, 2, 3])[:batch_size]
    src = torch.full((batch_size, 4), PAD_ID)
    tgt_in = torch.full((batch_size, width), PAD_ID)
    tgt_out = torch.full((batch_size, width), PAD_ID)
    for row, (source_length, length) in enumerate(zip(src_lengths.tolist(), target_lengths,
                                                      strict=True)):
        src[row, :source_length] = torch.randint(4, VOCAB, (source_length,), generator=generator)
        words = torch.randint(4, VOCAB, (length - 1,), generator=generator)
        tgt_in[row, 0], tgt_in[row, 1:length] = BOS_ID, words
        tgt_out[row, : length - 1], tgt_out[row, length - 1] = words, EOS_ID
    return src, src_lengths, tgt_in, tgt_out


def by_hand(model, src, src_lengths, tgt_in, tgt_out, eps: float) -> tuple[float, float]:
    """The formula, token by token in float64, skipping padding."""
    with torch.no_grad():
        features, _ = model(src, src_lengths, tgt_in)
        log_probs = torch.log_softmax(model.project(features).double(), dim=-1)  # (B, T, V)
    loss = nll_sum = 0.0
    for row in range(tgt_out.size(0)):
        for position in range(tgt_out.size(1)):
            target = int(tgt_out[row, position])
            if target == PAD_ID:
                continue
            nll = -float(log_probs[row, position, target])
            uniform = -float(log_probs[row, position].mean())
            loss += (1 - eps) * nll + eps * uniform
            nll_sum += nll
    return loss, nll_sum


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_loss_is_the_label_smoothing_formula_over_real_tokens(eps, tiny_model):
    model = tiny_model().eval()
    batch = padded_batch()
    loss, nll = SequenceLoss(model, label_smoothing=eps)(*batch)
    expected_loss, expected_nll = by_hand(model, *batch, eps)
    assert loss.shape == nll.shape == ()
    assert loss.item() == pytest.approx(expected_loss, rel=1e-5)
    assert nll.item() == pytest.approx(expected_nll, rel=1e-5)
    if eps > 0:
        assert loss.item() != pytest.approx(nll.item(), rel=1e-3)  # smoothing changed the loss
    # torch's own label smoothing (eps spread uniformly over V classes) is the same formula.
    with torch.no_grad():
        features, _ = model(*batch[:3])
        logits = model.project(features)
    reference = F.cross_entropy(logits.flatten(0, 1), batch[3].flatten(), ignore_index=PAD_ID,
                                label_smoothing=eps, reduction="sum")
    assert loss.item() == pytest.approx(reference.item(), rel=1e-5)


def test_padding_positions_change_nothing(tiny_model):
    """Whatever stands at padded target positions, and however wide the padding, same loss."""
    model = tiny_model().eval()
    src, src_lengths, tgt_in, tgt_out = padded_batch()
    objective = SequenceLoss(model, label_smoothing=0.1)
    loss, nll = objective(src, src_lengths, tgt_in, tgt_out)

    garbage_in = tgt_in.clone()
    padded = tgt_out == PAD_ID
    garbage_in[padded] = torch.randint(4, VOCAB, (int(padded.sum()),),
                                       generator=torch.Generator().manual_seed(1))
    assert not torch.equal(garbage_in, tgt_in)
    loss_garbage, nll_garbage = objective(src, src_lengths, garbage_in, tgt_out)
    torch.testing.assert_close(loss_garbage, loss)
    torch.testing.assert_close(nll_garbage, nll)

    wider_in = F.pad(tgt_in, (0, 3), value=PAD_ID)
    wider_out = F.pad(tgt_out, (0, 3), value=PAD_ID)
    loss_wider, nll_wider = objective(src, src_lengths, wider_in, wider_out)
    torch.testing.assert_close(loss_wider, loss)
    torch.testing.assert_close(nll_wider, nll)


def test_gradient_is_the_gradient_of_the_formula(tiny_model):
    """The loss is differentiable end to end, and its gradient is the formula's."""
    model = tiny_model().eval()
    batch = padded_batch()
    SequenceLoss(model, label_smoothing=0.2)(*batch)[0].backward()
    got = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    features, _ = model(*batch[:3])
    log_probs = torch.log_softmax(model.project(features), dim=-1)
    real = batch[3] != PAD_ID
    nll = -log_probs.gather(-1, batch[3].clamp(min=0).unsqueeze(-1)).squeeze(-1)
    smooth = -log_probs.mean(-1)
    ((0.8 * nll + 0.2 * smooth) * real).sum().backward()
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(got[name], parameter.grad, msg=name)


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_the_blockwise_kernel_and_the_formula_make_the_same_optimizer_step(tiny_model, dtype):
    """Training's criterion (seq2seq.ops.smoothed_cross_entropy) against the autograd formula
    on the same weights: one SGD step each, the same weights after it (fp32: to rounding;
    under bf16 autocast: within a bf16 rounding of the step). (Adam's first step is lr times
    the gradient's sign, which rounding flips where a gradient is near zero.)"""
    import copy

    from seq2seq.training.loss import label_smoothed_formula

    weights = {}
    for name, criterion in (("kernel", None), ("formula", label_smoothed_formula)):
        model = copy.deepcopy(tiny_model()).train()
        objective = SequenceLoss(model, label_smoothing=0.1,
                                 **({} if criterion is None else {"criterion": criterion}))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss, _ = objective(*padded_batch())
        loss.backward()
        optimizer.step()
        weights[name] = {key: value.clone() for key, value in model.state_dict().items()}
    tolerance = {"rtol": 1e-6, "atol": 1e-6} if dtype is None else {"rtol": 0, "atol": 2e-4}
    for key, value in weights["kernel"].items():
        torch.testing.assert_close(value, weights["formula"][key], **tolerance, msg=key)
