"""trainer.ema (seq2seq.training.ema): the weights' exponential moving average is what a run
validates and keeps, and a resumed run continues it exactly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from seq2seq.checkpoint import load_checkpoint
from seq2seq.config_types import ConfigError
from seq2seq.training.ema import WeightAverage
from seq2seq.training.run import train
from seq2seq.training.settings import TrainerSettings


def test_the_average_follows_its_formula():
    """The first update copies; with n updates made, the next moves 1 - d of the way to the
    weights, d = min(decay, (1 + n) / (10 + n)): ramped up, then the decay itself."""
    model = nn.Linear(3, 2)
    average = WeightAverage(model, 0.8)
    want = None
    for n in range(40):
        with torch.no_grad():
            model.weight.add_(float(n % 7) - 3)
        weights = model.weight.detach().clone()
        d = min(0.8, (1 + n) / (10 + n))
        want = weights if want is None else d * want + (1 - d) * weights
        average.update(model)
        torch.testing.assert_close(average.model.weight, want)
    assert (1 + 39) / (10 + 39) > 0.8  # the last updates ran at the decay itself
    assert average.state_dict()["updates"] == 40
    assert not average.model.training


@pytest.mark.parametrize("decay", [0, 1, 1.5, -0.1])
def test_a_decay_outside_0_1_is_refused(decay):
    with pytest.raises(ConfigError, match=r"^trainer.ema must be a decay in \(0, 1\)"):
        TrainerSettings.from_dict({"ema": decay})


def test_resumed_run_equals_uninterrupted_and_keeps_the_average(tiny_train_config, tmp_path):
    """Stopped after 20 steps and resumed to 40 = 40 steps straight: the trained weights and
    their average alike. The checkpoints are plain data, and the kept ones hold the average."""
    common = {"trainer.ema": 0.9, "trainer.valid_every": 20, "trainer.save_every": 20,
              "trainer.valid.max_sentences": 4, "model.dropout": 0.0}
    split = tmp_path / "split"
    train(tiny_train_config(**common, **{"trainer.max_steps": 20}), split)
    train(tiny_train_config(**common, **{"trainer.max_steps": 40, "trainer.resume": "auto"}),
          split)
    train(tiny_train_config(**common, **{"trainer.max_steps": 40}), tmp_path / "straight")
    last = [torch.load(path / "checkpoints" / "last.pt", weights_only=True)
            for path in (split, tmp_path / "straight")]
    assert last[1]["ema"]["updates"] == 40
    for key in ("model", "ema"):
        weights = [checkpoint[key] if key == "model" else checkpoint[key]["model"]
                   for checkpoint in last]
        for name, tensor in weights[1].items():
            assert torch.equal(weights[0][name], tensor), f"{key}: {name} differs after resume"
    # The last validation (step 40) scored the average; its checkpoint holds it, not the
    # trained weights.
    kept = load_checkpoint(next((tmp_path / "straight" / "checkpoints").glob("step0000040*.pt")))
    average, trained = last[1]["ema"]["model"], last[1]["model"]
    assert "ema" not in kept and all(torch.equal(kept["model"][name], tensor)
                                     for name, tensor in average.items())
    assert any(not torch.equal(trained[name], tensor) for name, tensor in average.items())
