"""trainer.keep_best: the K best ``step*-bleu*.pt`` checkpoints by validation BLEU are kept,
every one that falls out of the best K is deleted, also across a resume."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from seq2seq.checkpoint import load_checkpoint
from seq2seq.training.checkpointing import CheckpointManager
from seq2seq.training.run import train
from seq2seq.training.state import TrainerState

KEPT_NAME = re.compile(r"step0*(\d+)-bleu(\d+\.\d+)\.pt")


def kept_files(directory: Path) -> dict[tuple[int, float], Path]:
    """(step, BLEU) -> path of every ``step*-bleu*.pt`` file in ``directory``."""
    kept = {}
    for path in directory.glob("step*-bleu*.pt"):
        match = KEPT_NAME.fullmatch(path.name)
        assert match, f"unexpected checkpoint name {path.name}"
        kept[int(match[1]), float(match[2])] = path
    return kept


def saved_step(path: Path) -> int:
    """The step of the fake payloads :func:`validate` saves."""
    return torch.load(path, weights_only=True)["step"]


def best_of(history: list[tuple[int, float]], k: int) -> set[tuple[int, float]]:
    return set(sorted(history, key=lambda entry: -entry[1])[:k])


def validate(manager: CheckpointManager, state: TrainerState, step: int, bleu: float) -> None:
    state.step = step
    manager.record_validation(state, bleu, lambda: {"model": {}, "step": step})


@pytest.mark.parametrize("keep_best", [1, 3])
def test_keeps_the_k_best_and_deletes_those_that_drop_out(tmp_path, keep_best):
    manager = CheckpointManager(directory=tmp_path, keep_best=keep_best)
    state = TrainerState()
    history = []
    for step, bleu in zip(range(100, 1000, 100), [10, 20, 15, 5, 25, 18, 12, 30, 19],
                          strict=True):
        validate(manager, state, step, bleu)
        history.append((step, float(bleu)))
        assert set(kept_files(tmp_path)) == best_of(history, keep_best), f"after step {step}"
        best_step = max(history, key=lambda entry: entry[1])[0]
        assert saved_step(tmp_path / "best.pt") == best_step
    for (step, _), path in kept_files(tmp_path).items():
        assert saved_step(path) == step  # each file holds its own step's model


def test_a_resumed_run_goes_on_deleting_the_files_of_the_first(tmp_path):
    first = CheckpointManager(directory=tmp_path, keep_best=2)
    state = TrainerState()
    history = [(100, 10.0), (200, 20.0), (300, 15.0)]
    for step, bleu in history:
        validate(first, state, step, bleu)
    assert set(kept_files(tmp_path)) == {(200, 20.0), (300, 15.0)}

    resumed_state = TrainerState()
    resumed_state.load_state_dict(state.state_dict())  # what last.pt carries
    resumed = CheckpointManager(directory=tmp_path, keep_best=2)
    for step, bleu in [(400, 17.0), (500, 25.0)]:
        validate(resumed, resumed_state, step, bleu)
        history.append((step, bleu))
    assert set(kept_files(tmp_path)) == best_of(history, 2) == {(500, 25.0), (200, 20.0)}


def test_keep_best_zero_keeps_only_best_pt(tmp_path):
    manager = CheckpointManager(directory=tmp_path, keep_best=0)
    state = TrainerState()
    for step, bleu in [(100, 10.0), (200, 20.0), (300, 15.0)]:
        validate(manager, state, step, bleu)
    assert kept_files(tmp_path) == {}
    assert saved_step(tmp_path / "best.pt") == 200


def test_training_keeps_the_k_best_validations(tiny_train_config, tmp_path,
                                               fake_validation_bleu):
    """Through train(): the files left are those of the 2 best validation BLEUs."""
    bleus = [10.0, 30.0, 20.0, 5.0, 25.0, 15.0]
    handed_out = fake_validation_bleu(bleus)
    run_dir = tmp_path / "run"
    cfg = tiny_train_config(**{
        "trainer.max_steps": 18, "trainer.valid_every": 3, "trainer.save_every": 1000,
        "trainer.valid.max_sentences": 8, "trainer.keep_best": 2})
    result = train(cfg, run_dir)
    assert handed_out == bleus
    assert (result["best_bleu"], result["best_step"]) == (30.0, 6)
    checkpoints = run_dir / "checkpoints"
    kept = kept_files(checkpoints)
    assert set(kept) == {(6, 30.0), (15, 25.0)}
    for (step, _), path in kept.items():
        assert load_checkpoint(path)["trainer_state"]["step"] == step
    assert load_checkpoint(checkpoints / "best.pt")["trainer_state"]["step"] == 6
    assert sorted(p.name for p in checkpoints.iterdir() if not KEPT_NAME.fullmatch(p.name)) == [
        "best.pt", "last.pt"]
