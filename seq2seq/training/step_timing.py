"""``trainer.precision=auto``'s workload: the run's own training step, timed on a copy.

:func:`training_workload` gives :func:`seq2seq.precision.choose_cpu_precision` a step of the
model being trained (forward, loss, backward and optimizer) on a few of the run's own batches,
in fp32 and under bf16 autocast alternately. It runs on a deep copy of the objective and the
optimizer, with the random state restored after, so that a run trains the same whether the
measurement was cached or made now.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import Tensor, nn

from seq2seq.data.batching import TokenBucketSampler, collate
from seq2seq.data.vocab import PAD_ID
from seq2seq.precision import (
    STEP_BUDGET_S,
    STEP_REPEATS,
    Workload,
    autocast,
    model_description,
    time_alternately,
)

BATCHES = 1 + STEP_REPEATS  # one warm-up pair, then the timed ones, each on its own batch


def first_batches(train_data, *, max_tokens: int, max_sentences: int | None,
                  bucket_size: int, seed: int, count: int = BATCHES) -> list[tuple[Tensor, ...]]:
    """The first ``count`` batches of a sampler like the run's (its own, so that the run's
    order is untouched), as ``(src, src_lengths, tgt_in, tgt_out)``."""
    sampler = TokenBucketSampler(src_lengths=train_data.src_lengths,
                                 tgt_lengths=train_data.tgt_lengths, max_tokens=max_tokens,
                                 max_sentences=max_sentences, bucket_size=bucket_size,
                                 shuffle=True, seed=seed)
    batches = []
    for indices in sampler:
        batch = collate([train_data[index] for index in indices], indices)
        batches.append((batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out))
        if len(batches) == count:
            break
    return batches


def training_workload(objective: nn.Module, optimizer: torch.optim.Optimizer,
                      batches: Callable[[], list[tuple[Tensor, ...]]], *, device: torch.device,
                      max_tokens: int) -> Workload:
    """The training step of ``objective`` (a :class:`~seq2seq.training.loss.SequenceLoss`) and
    ``optimizer`` on the batches ``batches()`` makes (``(src, src_lengths, tgt_in, tgt_out)``,
    moved to ``device`` but the lengths; made only when the step is timed, not on a cache
    hit), as a :class:`Workload` named by the model and the batch size."""
    name = (f"the training step of {model_description(objective.model)} on "
            f"{max_tokens:,}-token batches")

    def measure():
        trial, trial_optimizer = copy.deepcopy((objective, optimizer))  # one memo: tied params
        on_device = [(src.to(device), src_lengths, tgt_in.to(device), tgt_out.to(device))
                     for src, src_lengths, tgt_in, tgt_out in batches()]

        def repetition(dtype: torch.dtype | None, pair: int) -> None:
            batch = on_device[pair % len(on_device)]
            with autocast(device.type, dtype):
                loss, _ = trial(*batch)
            (loss / batch[3].ne(PAD_ID).sum().clamp(min=1)).backward()
            trial_optimizer.step()
            trial_optimizer.zero_grad(set_to_none=True)

        with torch.random.fork_rng(devices=[]):  # dropout's draws: the run's stay its own
            return time_alternately(repetition, repeats=STEP_REPEATS, budget_s=STEP_BUDGET_S)

    return Workload(name, measure)
