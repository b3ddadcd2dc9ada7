"""Checkpoint averaging (seq2seq.training.averaging and seq2seq-average over it), on synthetic
payloads: the average is the mean of the tensors, mismatches are refused; at the end of a run,
the kept checkpoints are averaged and validated from the run's parts."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch

from seq2seq.checkpoint import FORMAT_VERSION, CheckpointError, load_checkpoint, save_checkpoint
from seq2seq.cli.average import main as average_main
from seq2seq.training.averaging import average_checkpoints, average_recent
from seq2seq.training.checkpoint_manager import CheckpointManager
from seq2seq.training.distributed import DistributedContext
from seq2seq.training.state import TrainerState


def synthetic_payload(seed: int, *, tokenizer_bytes: bytes = b"spm model", **model_changes):
    """A checkpoint-shaped dict: random float weights (fp32 and fp16), an integer buffer,
    tokenizers as uint8 tensors and the training-only entries a last.pt carries."""
    generator = torch.Generator().manual_seed(seed)
    model = {
        "encoder.weight": torch.randn(4, 3, generator=generator),
        "decoder.bias": torch.randn(5, generator=generator),
        "half.weight": torch.randn(2, 2, generator=generator).half(),
        "steps_seen": torch.tensor([seed, seed + 1]),  # an integer entry
    }
    model.update(model_changes)
    tokens = torch.frombuffer(bytearray(tokenizer_bytes), dtype=torch.uint8).clone()
    return {
        "format_version": FORMAT_VERSION,
        "model": model,
        "config": {"model": {"embed_dim": 3}, "seed": seed},
        "tokenizers": {"joint": True, "src": tokens, "tgt": tokens},
        "optimizer": {"state": {}, "param_groups": []},
        "trainer_state": {"step": seed},
        "rng": {"torch": torch.zeros(3, dtype=torch.uint8)},
    }


def expected_mean(payloads: list[dict], name: str) -> torch.Tensor:
    stacked = torch.stack([payload["model"][name].double() for payload in payloads])
    return stacked.mean(0).to(payloads[0]["model"][name].dtype)


def average_payloads(payloads: list[dict], names: list[str] | None = None) -> dict:
    """average_checkpoints of the payloads saved under ``names`` (default a.pt, b.pt, ...)
    in a fresh folder, named as given in its messages."""
    names = names or [f"{chr(ord('a') + index)}.pt" for index in range(len(payloads))]
    with tempfile.TemporaryDirectory() as folder:
        for payload, name in zip(payloads, names, strict=True):
            save_checkpoint(payload, Path(folder, name))
        started_in = os.getcwd()
        os.chdir(folder)
        try:
            return average_checkpoints(names)
        finally:
            os.chdir(started_in)


def test_average_of_two_checkpoints_is_the_mean_of_their_tensors():
    first, second = synthetic_payload(1), synthetic_payload(2)
    averaged = average_payloads([first, second])
    for name in ("encoder.weight", "decoder.bias"):
        torch.testing.assert_close(averaged["model"][name],
                                   (first["model"][name] + second["model"][name]) / 2)
        assert not torch.equal(averaged["model"][name], first["model"][name])
    half = averaged["model"]["half.weight"]
    assert half.dtype == torch.float16
    torch.testing.assert_close(half, expected_mean([first, second], "half.weight"))
    # Integer entries come from the first checkpoint, unchanged.
    assert torch.equal(averaged["model"]["steps_seen"], first["model"]["steps_seen"])
    # The first one's config and tokenizers, no training state, the sources listed.
    assert averaged["config"] == first["config"]
    assert torch.equal(averaged["tokenizers"]["src"], first["tokenizers"]["src"])
    assert not {"optimizer", "trainer_state", "rng"} & set(averaged)
    assert averaged["averaged_from"] == ["a.pt", "b.pt"]
    # The inputs are left as they were.
    untouched = synthetic_payload(1)["model"]["encoder.weight"]
    assert torch.equal(first["model"]["encoder.weight"], untouched)


def test_nothing_to_average_is_refused():
    with pytest.raises(CheckpointError, match="no checkpoints to average"):
        average_checkpoints([])


def test_average_checkpoints_of_files_is_the_mean_and_loads(tmp_path):
    payloads = [synthetic_payload(seed) for seed in (1, 2, 3)]
    paths = []
    for index, payload in enumerate(payloads):
        paths.append(tmp_path / f"step{index}.pt")
        save_checkpoint(payload, paths[-1])
    averaged = average_checkpoints(paths)
    assert averaged["averaged_from"] == [str(path) for path in paths]
    for name in ("encoder.weight", "decoder.bias", "half.weight"):
        torch.testing.assert_close(averaged["model"][name], expected_mean(payloads, name))
    save_checkpoint(averaged, tmp_path / "averaged.pt")
    reloaded = load_checkpoint(tmp_path / "averaged.pt")
    assert torch.equal(reloaded["model"]["encoder.weight"], averaged["model"]["encoder.weight"])


@pytest.mark.parametrize(("other", "message"), [
    (synthetic_payload(2, **{"extra.weight": torch.zeros(1)}),
     r"has different parameters than .*unexpected: \['extra.weight'\]"),
    (synthetic_payload(2, **{"decoder.bias": torch.zeros(6)}),
     r"cannot average: decoder.bias has shape \(6,\) in b.pt but \(5,\) in a.pt"),
    (synthetic_payload(2, **{"decoder.bias": torch.zeros(5, dtype=torch.int64)}),
     r"cannot average: decoder.bias is torch.int64 in b.pt but torch.float32 in a.pt"),
    (synthetic_payload(2, tokenizer_bytes=b"another spm model"),
     r"cannot average: b.pt and a.pt use different tokenizers"),
])
def test_mismatched_payloads_are_refused_naming_the_difference(other, message):
    with pytest.raises(CheckpointError, match=message):
        average_payloads([synthetic_payload(1), other], names=["a.pt", "b.pt"])


def test_cli_writes_the_average(tmp_path, capsys):
    first, second = tmp_path / "a.pt", tmp_path / "b.pt"
    save_checkpoint(synthetic_payload(1), first)
    save_checkpoint(synthetic_payload(2), second)
    output = tmp_path / "out" / "avg.pt"
    average_main([str(first), str(second), f"output={output}"])
    assert f"averaged 2 checkpoints into {output}" in capsys.readouterr().err
    written = load_checkpoint(output)
    assert written["averaged_from"] == [str(first), str(second)]
    torch.testing.assert_close(written["model"]["encoder.weight"],
                               expected_mean([synthetic_payload(1), synthetic_payload(2)],
                                             "encoder.weight"))


@pytest.mark.parametrize(("changes", "message"), [
    ({"model_changes": {"extra.weight": torch.zeros(1)}}, "has different parameters than"),
    ({"tokenizer_bytes": b"another spm model"}, "use different tokenizers"),
])
def test_cli_refuses_mismatched_params_or_tokenizers(tmp_path, capsys, changes, message):
    first, second = tmp_path / "a.pt", tmp_path / "b.pt"
    save_checkpoint(synthetic_payload(1), first)
    other = synthetic_payload(2, tokenizer_bytes=changes.get("tokenizer_bytes", b"spm model"),
                              **changes.get("model_changes", {}))
    save_checkpoint(other, second)
    output = tmp_path / "avg.pt"
    with pytest.raises(SystemExit, match="1"):
        average_main([str(first), str(second), f"output={output}"])
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error and error.count("\n") == 1, error
    assert not output.exists()


def test_cli_refuses_an_unreadable_checkpoint(tmp_path, capsys):
    first, broken = tmp_path / "a.pt", tmp_path / "broken.pt"
    save_checkpoint(synthetic_payload(1), first)
    broken.write_bytes(b"not a checkpoint")
    with pytest.raises(SystemExit, match="1"):
        average_main([str(first), str(broken), f"output={tmp_path / 'o.pt'}"])
    assert "truncated or corrupted" in capsys.readouterr().err


# -- at the end of a run: average_recent from the run's parts, no trainer ----------------------
class RecordingValidator:
    """Scores every model with a fixed BLEU and keeps its weights (the Validator's interface:
    ``output_dir`` and ``evaluate(model, device, hyp_path)``)."""

    def __init__(self, output_dir, bleu: float) -> None:
        self.output_dir, self.bleu, self.evaluated = output_dir, bleu, []

    def evaluate(self, model, device, hyp_path):
        self.evaluated.append({name: value.clone() for name, value in model.state_dict().items()})
        scores = {"loss": 1.0, "ppl": 2.7, "bleu": self.bleu, "chrf": 50.0, "seconds": 0.1}
        return scores, ["a hypothesis"], None


def kept_linear_checkpoints(directory, seeds) -> list[str]:
    """Checkpoints of nn.Linear(3, 2) models in ``directory/recent/``; their names."""
    names = []
    for seed in seeds:
        torch.manual_seed(seed)
        names.append(f"recent/step{seed:07d}.pt")
        save_checkpoint({"format_version": FORMAT_VERSION,
                         "model": torch.nn.Linear(3, 2).state_dict(), "config": {}},
                        directory / names[-1])
    return names


def test_average_recent_averages_validates_and_records_from_the_run_parts(tmp_path):
    checkpoints = CheckpointManager(directory=tmp_path, keep_best=0, average_last=2)
    names = kept_linear_checkpoints(tmp_path, seeds=(3, 6))
    state = TrainerState(step=6, best_bleu=20.0, best_step=3, recent_checkpoints=names)
    model = torch.nn.Linear(3, 2)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    validator = RecordingValidator(tmp_path / "validation", bleu=25.0)
    average_recent(state, checkpoints, model=model, validator=validator,
                   context=DistributedContext())
    averaged = load_checkpoint(tmp_path / "averaged.pt")
    assert averaged["averaged_from"] == names
    payloads = [load_checkpoint(tmp_path / name) for name in names]
    for name, tensor in averaged["model"].items():
        torch.testing.assert_close(tensor, expected_mean(payloads, name))
        assert torch.equal(validator.evaluated[-1][name], tensor), name  # the average scored
        assert torch.equal(model.state_dict()[name], before[name]), name  # the model untouched
    assert (state.averaged_bleu, state.averaged_from) == (25.0, names)


def test_average_recent_of_one_kept_checkpoint_records_none(tmp_path):
    checkpoints = CheckpointManager(directory=tmp_path, keep_best=0, average_last=2)
    state = TrainerState(step=3, recent_checkpoints=kept_linear_checkpoints(tmp_path, seeds=(3,)))
    validator = RecordingValidator(tmp_path / "validation", bleu=25.0)
    average_recent(state, checkpoints, model=torch.nn.Linear(3, 2), validator=validator,
                   context=DistributedContext())
    assert (state.averaged_bleu, state.averaged_from, validator.evaluated) == (None, [], [])
    assert not (tmp_path / "averaged.pt").exists()
