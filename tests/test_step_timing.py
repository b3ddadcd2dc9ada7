"""training.step_timing: trainer.precision=auto times the run's own step, on a copy.

Timings are injected (the repetitions run, their seconds are made up): auto chooses from
them, names what it timed in its log line, and the run that measured trains exactly as the
run that read the cache (the copy and the restored random state leave nothing behind).
"""

from __future__ import annotations

import logging

import pytest
import torch

import seq2seq.training.step_timing as step_timing
from seq2seq.checkpoint import load_checkpoint
from seq2seq.precision import CACHE_DIR_ENV, ProbeTimes
from seq2seq.training.run import train


def injected_timing(speedup: float, modes: list):
    """A time_alternately that runs each repetition once in both modes (the step really runs)
    and says bf16 took 1 / speedup of fp32's time."""

    def fake(repetition, **budget):
        for dtype in (None, torch.bfloat16):
            repetition(dtype, 0)
            modes.append(dtype)
        return ProbeTimes(fp32_seconds=0.3, bf16_seconds=0.3 / speedup)

    return fake


@pytest.mark.parametrize("speedup", [1.5, 0.8])
def test_auto_chooses_by_the_runs_own_step_and_a_measured_run_trains_as_a_cached_one(
        tiny_train_config, tmp_path, monkeypatch, caplog, speedup):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    modes: list = []
    monkeypatch.setattr(step_timing, "time_alternately", injected_timing(speedup, modes))
    cfg = tiny_train_config(**{"trainer.precision": "auto", "trainer.max_steps": 4,
                               "trainer.valid_every": "null", "trainer.max_epochs": 1})
    chosen = "bf16" if speedup > 1 else "fp32"
    weights = []
    for run in ("measured", "cached"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="seq2seq.training.trainer"):
            train(cfg, tmp_path / run)
        lines = [record.getMessage() for record in caplog.records
                 if record.getMessage().startswith("trainer.precision=auto")]
        assert len(lines) == 1 and lines[0].startswith(
            f"trainer.precision=auto -> {chosen} (bf16 {speedup:.2f}x fp32 on this CPU for the "
            "training step of Seq2Seq ")
        assert f"-token batches, {'measured now' if run == 'measured' else 'measured 20'}" \
            in lines[0]
        checkpoint = load_checkpoint(tmp_path / run / "checkpoints" / "last.pt")
        assert checkpoint["config"]["trained_precision"] == chosen
        weights.append(checkpoint["model"])
    assert modes == [None, torch.bfloat16]  # timed once, in both modes; then read back
    for name, tensor in weights[0].items():
        assert torch.equal(tensor, weights[1][name]), name


def test_the_workload_runs_on_a_copy_and_leaves_the_random_state(tiny_model, monkeypatch):
    from seq2seq.training.loss import SequenceLoss

    model = tiny_model()
    objective = SequenceLoss(model, label_smoothing=0.1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    generator = torch.Generator().manual_seed(3)
    src = torch.randint(4, 20, (6, 5), generator=generator)
    batch = (src, torch.full((6,), 5), torch.randint(4, 20, (6, 4), generator=generator),
             torch.randint(4, 20, (6, 4), generator=generator))
    modes: list = []
    monkeypatch.setattr(step_timing, "time_alternately", injected_timing(1.2, modes))
    made = []
    workload = step_timing.training_workload(objective, optimizer,
                                             lambda: made.append(1) or [batch],
                                             device=torch.device("cpu"), max_tokens=1600)
    assert not made  # the batches are made only when the step is timed (not on a cache hit)
    assert workload.name.startswith("the training step of ")
    assert workload.name.endswith(" on 1,600-token batches")
    state = torch.get_rng_state()
    assert workload.measure() == ProbeTimes(0.3, 0.25)
    assert made == [1]
    assert modes == [None, torch.bfloat16]
    assert torch.equal(torch.get_rng_state(), state)
    assert not optimizer.state  # the run's optimizer made no step
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name
