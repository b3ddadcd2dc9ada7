"""Gradient accumulation: a step over micro-batches equals one step over the batch of them all,
and under DDP the partial group at an epoch's end still synchronises the ranks (with two real
torchrun ranks: ``test_training.py::test_two_process_gloo_torchrun_keeps_ranks_identical``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from seq2seq.data.batching import collate
from seq2seq.training.distributed import DistributedContext
from seq2seq.training.schedulers import ConstantSchedule
from seq2seq.training.settings import BatchSettings, TrainerSettings
from seq2seq.training.trainer import Trainer

VOCAB = 20


class ToyPairs:
    """The two things the trainer reads from a dataset: lengths and (src, tgt) id arrays."""

    def __init__(self, pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
        self.pairs = pairs
        self.src_lengths = np.array([len(s) for s, _ in pairs])
        self.tgt_lengths = np.array([len(t) for _, t in pairs])

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int):
        return self.pairs[index]


def toy_pairs(count: int, seed: int) -> ToyPairs:
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(count):
        length = int(rng.integers(2, 9))
        src = rng.integers(4, VOCAB, size=length)
        pairs.append((src, src[::-1].copy()))  # lengths differ between rows: padding differs
    return ToyPairs(pairs)


def make_trainer(model, tmp_path: Path, *, accumulate: int, label_smoothing: float = 0.0) -> Trainer:
    data = toy_pairs(12, seed=3)
    return Trainer(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        schedule=ConstantSchedule(),
        train_data=data,
        valid_data=data,
        valid_sources=["unused"] * len(data),
        valid_references=["unused"] * len(data),
        tokenizers=None,
        settings=TrainerSettings(accumulate_grad_batches=accumulate, grad_clip=None,
                                 label_smoothing=label_smoothing, max_steps=1),
        batch=BatchSettings(max_tokens=40),
        run_dir=tmp_path,
        config={},
        context=DistributedContext(),
    )


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_accumulated_micro_batches_make_the_step_of_one_big_batch(
    tmp_path, label_smoothing, tiny_model
):
    data = toy_pairs(12, seed=3)
    groups = [[0, 1, 2], [3, 4, 5, 6], [7, 8, 9, 10, 11]]  # three micro-batches, unequal sizes
    micro = [collate([data[i] for i in g], g) for g in groups]
    everything = collate([data[i] for g in groups for i in g], [i for g in groups for i in g])

    accumulated = make_trainer(tiny_model(), tmp_path / "a", accumulate=3, label_smoothing=label_smoothing)
    accumulated.model.train()
    accumulated._accumulate(micro)
    accumulated._optimizer_step(sum(b.num_tgt_tokens for b in micro))

    single = make_trainer(tiny_model(), tmp_path / "b", accumulate=1, label_smoothing=label_smoothing)
    single.model.train()
    single._accumulate([everything])
    single._optimizer_step(everything.num_tgt_tokens)

    assert accumulated.state.step == single.state.step == 1
    assert accumulated.state.tokens_seen == single.state.tokens_seen
    moved = 0.0
    for (name, a), b, start in zip(accumulated.model.named_parameters(),
                                   single.model.parameters(), tiny_model().parameters(),
                                   strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"{name} differs")
        moved = max(moved, float((a.detach() - start.detach()).abs().max()))
    assert moved > 1e-3  # the step did change the parameters


def test_the_last_micro_batch_of_a_group_synchronises_and_the_others_do_not(
    tmp_path, tiny_model
):
    """What DDP sees: no_sync() around every backward of a group but the last, partial groups
    included (a partial group whose backwards all ran under no_sync desynchronised ranks)."""
    trainer = make_trainer(tiny_model(), tmp_path, accumulate=4)
    synced: list[bool] = []

    class RecordingObjective(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner
            self.in_no_sync = False

        def no_sync(self):
            outer = self

            class Context:
                def __enter__(self):
                    outer.in_no_sync = True

                def __exit__(self, *exc):
                    outer.in_no_sync = False

            return Context()

        def forward(self, *args):
            synced.append(not self.in_no_sync)
            return self.inner(*args)

    trainer.objective = RecordingObjective(trainer.objective)
    data = toy_pairs(12, seed=3)
    batches = [collate([data[i]], [i]) for i in range(6)]
    trainer._accumulate(batches[:4])
    trainer._accumulate(batches[4:])  # the partial group at an epoch's end
    assert synced == [False, False, False, True, False, True]
