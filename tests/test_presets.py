"""The experiment presets (``seq2seq/configs/experiment``): each composes, builds a model that
trains a step, and says what its comments say it is."""

from __future__ import annotations

import pytest
import torch
from conftest import compose_train_config
from omegaconf import OmegaConf

from seq2seq import CONFIG_DIR
from seq2seq.models.build import build_model
from seq2seq.training.loss import SequenceLoss

PRESETS = sorted(path.stem for path in (CONFIG_DIR / "experiment").glob("*.yaml"))


def composed(*overrides: str) -> dict:
    """The train config with ``overrides`` in the order given, resolved to plain containers."""
    return OmegaConf.to_container(compose_train_config(overrides), resolve=True)


def preset(name: str, *overrides: str) -> dict:
    return composed(f"experiment={name}", *overrides)


def differences(old: dict, new: dict, prefix: str = "") -> dict[str, tuple]:
    """Dotted keys whose values differ between two nested dicts, with both values."""
    found = {}
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found.update(differences(a, b, f"{prefix}{key}."))
        elif a != b:
            found[f"{prefix}{key}"] = (a, b)
    return found


def test_the_presets_are_the_ones_documented():
    assert PRESETS == ["multi30k_best", "multi30k_gru_additive", "multi30k_luong_fast",
                       "multi30k_transformer", "multi30k_transformer_gpu"]


def test_the_gpu_preset_is_the_cpu_transformer_with_a_gpus_batch_and_the_linear_rule():
    # Its comment: the same model, regularization and tokenizer; 4x the tokens a step, the
    # learning rate scaled linearly with them, bf16 on CUDA; validation on valid_every alone.
    cpu, gpu = preset("multi30k_transformer"), preset("multi30k_transformer_gpu")
    assert gpu["batch"]["max_tokens"] == 4 * cpu["batch"]["max_tokens"]
    assert gpu["optimizer"]["lr"] == pytest.approx(
        cpu["optimizer"]["lr"] * gpu["batch"]["max_tokens"] / cpu["batch"]["max_tokens"])
    assert gpu["optimizer"]["weight_decay"] == cpu["optimizer"]["weight_decay"]
    assert (gpu["trainer"]["device"], gpu["trainer"]["precision"]) == ("cuda", "bf16")
    assert gpu["trainer"]["valid_each_epoch"] is False
    found = differences(cpu, gpu)
    assert not [key for key in found if key.startswith(("model.", "tokenizer."))], found


@pytest.mark.parametrize("name", PRESETS)
def test_each_preset_builds_a_model_that_trains_a_step(name):
    # Shrunk: an RNN by its hidden sizes, a Transformer by its feed-forward sizes.
    sizes = ("model.encoder.ffn_dim=8", "model.decoder.ffn_dim=8") if "transformer" in name \
        else ("model.encoder.hidden_size=4", "model.decoder.hidden_size=8")
    config = preset(name, "model.embed_dim=8", *sizes)
    torch.manual_seed(0)
    model = build_model(config["model"], src_vocab_size=20, tgt_vocab_size=30)
    objective = SequenceLoss(model, label_smoothing=config["trainer"]["label_smoothing"])
    src = torch.randint(4, 20, (3, 5))
    tgt = torch.randint(4, 30, (3, 6))
    loss, _ = objective(src, torch.full((3,), 5), tgt, tgt)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_the_fast_preset_is_like_for_like_without_input_feeding_with_scaled_dot():
    # The preset's comment: multi30k_gru_additive without input feeding, with the scaled
    # dot-product scorer (the study's fastest of its best two), precision auto.
    like, fast = preset("multi30k_gru_additive"), preset("multi30k_luong_fast")
    found = differences(like, fast)
    attention = {key: value for key, value in found.items() if key.startswith("model.attention.")}
    assert attention["model.attention._target_"][1] == "scaled_dot"
    rest = {key: value for key, value in found.items() if key not in attention}
    assert rest == {
        "model.decoder.input_feeding": (True, False),
        "trainer.precision": (like["trainer"]["precision"], "auto"),
    }


def test_an_attention_override_still_wins_over_the_fast_presets_scorer():
    # The study's sweeps (README) run the fast preset with every scorer, in either order.
    config = preset("multi30k_luong_fast", "model/attention=additive")
    assert config["model"]["attention"]["_target_"] == "additive"
    config = composed("model/attention=gaussian", "experiment=multi30k_luong_fast")
    assert config["model"]["attention"]["_target_"] == "gaussian"
