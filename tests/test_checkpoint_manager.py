"""trainer.keep_best: the K best ``step*-bleu*.pt`` checkpoints by validation BLEU are kept,
every one that falls out of the best K is deleted, also across a resume."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from seq2seq.checkpoint import load_checkpoint
from seq2seq.training.checkpoint_manager import CheckpointManager
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


# -- trainer.average_last: the last N validations' models, averaged at the end ---------------
def recent_files(directory: Path) -> list[str]:
    return sorted(f"recent/{path.name}" for path in (directory / "recent").glob("*.pt"))


def test_average_last_keeps_the_models_of_the_last_n_validations(tmp_path):
    manager = CheckpointManager(directory=tmp_path, keep_best=1, average_last=2)
    state = TrainerState()
    for step, bleu in [(100, 10.0), (200, 20.0), (300, 15.0), (400, 5.0)]:
        validate(manager, state, step, bleu)
        expected = [f"recent/step{s:07d}.pt" for s in range(max(100, step - 100), step + 1, 100)]
        assert state.recent_checkpoints == expected, f"after step {step}"
        assert recent_files(tmp_path) == expected, f"after step {step}"
    for name in state.recent_checkpoints:  # each file holds its own step's model
        assert saved_step(tmp_path / name) == int(name[len("recent/step"):-3])
    assert set(kept_files(tmp_path)) == {(200, 20.0)}  # keep_best unaffected


def test_average_last_goes_on_after_a_resume_and_removes_orphans(tmp_path):
    first = CheckpointManager(directory=tmp_path, keep_best=0, average_last=3)
    state = TrainerState()
    for step in (100, 200, 300):
        validate(first, state, step, float(step))
    saved = state.state_dict()  # what last.pt at step 300 carries
    validate(first, state, 400, 1.0)  # then the run is killed before it saves last.pt again

    resumed_state = TrainerState()
    resumed_state.load_state_dict(saved)
    resumed = CheckpointManager(directory=tmp_path, keep_best=0, average_last=2)  # N lowered
    validate(resumed, resumed_state, 350, 2.0)
    assert resumed_state.recent_checkpoints == ["recent/step0000300.pt", "recent/step0000350.pt"]
    # step 400 (written after last.pt, listed nowhere) and the older ones are gone.
    assert recent_files(tmp_path) == resumed_state.recent_checkpoints


def test_average_last_off_writes_no_recent_folder(tmp_path):
    manager = CheckpointManager(directory=tmp_path, keep_best=1)
    state = TrainerState()
    validate(manager, state, 100, 10.0)
    assert not (tmp_path / "recent").exists() and state.recent_checkpoints == []


def assert_average_of(averaged: dict, paths: list[Path]) -> None:
    """averaged.pt's weights are the mean of ``paths``' and differ from each of them."""
    models = [load_checkpoint(path)["model"] for path in paths]
    for name, tensor in averaged["model"].items():
        expected = sum(model[name].double() for model in models) / len(models)
        torch.testing.assert_close(tensor, expected.to(tensor.dtype))
    assert any(not torch.equal(averaged["model"][name], models[-1][name])
               for name in averaged["model"])


def averaged_scalars(run_dir: Path) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars("valid/averaged_bleu")]


@pytest.mark.parametrize(("averaged_bleu", "better"), [(40.0, "averaged.pt"), (12.0, "best.pt")])
def test_training_averages_the_last_validations(tiny_train_config, tmp_path, fake_validation_bleu,
                                                caplog, monkeypatch, averaged_bleu, better):
    """average_last=2: the models of the last 2 validations (steps 15 and 18) are kept, and at
    the end averaged into averaged.pt, validated (the 7th BLEU) and reported against best.pt."""
    from seq2seq.training.validation import Validator

    bleus = [10.0, 30.0, 20.0, 5.0, 25.0, 15.0, averaged_bleu]
    handed_out = fake_validation_bleu(bleus)
    evaluated = []  # the weights of every model Validator.evaluate scored
    real_evaluate = Validator.evaluate

    def spy(self, model, *args, **kwargs):
        evaluated.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return real_evaluate(self, model, *args, **kwargs)

    monkeypatch.setattr(Validator, "evaluate", spy)
    run_dir = tmp_path / "run"
    cfg = tiny_train_config(**{
        "trainer.max_steps": 18, "trainer.valid_every": 3, "trainer.save_every": 1000,
        "trainer.valid.max_sentences": 8, "trainer.keep_best": 1, "trainer.average_last": 2})
    with caplog.at_level("INFO"):
        result = train(cfg, run_dir)
    assert handed_out == bleus  # six validations, then the averaged model's
    checkpoints = run_dir / "checkpoints"
    recent = ["recent/step0000015.pt", "recent/step0000018.pt"]
    assert recent_files(checkpoints) == recent
    averaged = load_checkpoint(checkpoints / "averaged.pt")
    assert averaged["averaged_from"] == recent and "optimizer" not in averaged
    assert_average_of(averaged, [checkpoints / name for name in recent])
    assert len((run_dir / "validation" / "averaged.hyp").read_text().splitlines()) == 8
    # The 7th model validated is the average (the same Validator as the six validations).
    assert len(evaluated) == 7
    for name, tensor in averaged["model"].items():
        assert torch.equal(evaluated[-1][name], tensor), name

    line = f"averaged last 2: BLEU {averaged_bleu:.2f} vs best.pt 30.00 (step 6)"
    assert f"{line}; the better is {better}" in caplog.text
    assert result == {"best_bleu": 30.0, "best_step": 6, "steps": 18,
                      "averaged_bleu": averaged_bleu, "better_checkpoint": f"checkpoints/{better}"}
    state = load_checkpoint(checkpoints / "last.pt")["trainer_state"]
    assert (state["recent_checkpoints"], state["averaged_from"]) == (recent, recent)
    assert state["averaged_bleu"] == averaged_bleu
    assert averaged_scalars(run_dir) == [(18, averaged_bleu)]


def test_training_averages_after_a_resume(tiny_train_config, tmp_path, caplog):
    """A resumed run keeps going with the files the first one listed, deletes them as they drop
    out, and averages its own last validations; resuming a finished run does not redo it."""
    run_dir = tmp_path / "run"
    options = {"trainer.valid_every": 3, "trainer.save_every": 1000,
               "trainer.valid.max_sentences": 8, "trainer.average_last": 2}
    first = train(tiny_train_config(**options, **{"trainer.max_steps": 9}), run_dir)
    checkpoints = run_dir / "checkpoints"
    assert load_checkpoint(checkpoints / "averaged.pt")["averaged_from"] == [
        "recent/step0000006.pt", "recent/step0000009.pt"]
    assert "averaged_bleu" in first

    # One more validation: the average needs the file the first run recorded (step 9).
    resumed = {**options, "trainer.max_steps": 12, "trainer.resume": "auto"}
    result = train(tiny_train_config(**resumed), run_dir)
    recent = ["recent/step0000009.pt", "recent/step0000012.pt"]
    assert recent_files(checkpoints) == recent
    averaged = load_checkpoint(checkpoints / "averaged.pt")
    assert averaged["averaged_from"] == recent
    assert_average_of(averaged, [checkpoints / name for name in recent])
    state = load_checkpoint(checkpoints / "last.pt")["trainer_state"]
    assert state["averaged_bleu"] == result["averaged_bleu"]

    caplog.clear()
    before = (checkpoints / "averaged.pt").stat().st_mtime_ns
    with caplog.at_level("INFO"):
        again = train(tiny_train_config(**resumed), run_dir)
    assert again == result
    assert "already averages" in caplog.text and "validation of" not in caplog.text
    assert (checkpoints / "averaged.pt").stat().st_mtime_ns == before


def test_training_with_one_validation_skips_the_average(tiny_train_config, tmp_path, caplog):
    run_dir = tmp_path / "run"
    cfg = tiny_train_config(**{
        "trainer.max_steps": 3, "trainer.valid_every": 1000, "trainer.valid.max_sentences": 8,
        "trainer.average_last": 3})
    with caplog.at_level("INFO"):
        result = train(cfg, run_dir)
    assert "1 validation checkpoint(s) kept, nothing to average" in caplog.text
    assert "averaged_bleu" not in result
    assert recent_files(run_dir / "checkpoints") == ["recent/step0000003.pt"]
    assert not (run_dir / "checkpoints" / "averaged.pt").exists()
