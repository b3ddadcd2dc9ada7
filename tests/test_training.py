"""End-to-end training on a tiny synthetic task: BLEU, checkpoints, resume, TensorBoard, NaN."""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from seq2seq.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from seq2seq.training.run import train
from seq2seq.training.trainer import TrainingError

ROOT = Path(__file__).resolve().parents[1]


def validation_bleus(caplog) -> list[float]:
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("validation step")]
    return [float(line.split("BLEU ")[1].split()[0]) for line in lines]


def test_training_improves_validation_bleu_and_writes_the_run_folder(tiny_train_config, tmp_path,
                                                                     caplog):
    run_dir = tmp_path / "run"
    cfg = tiny_train_config(**{"trainer.max_steps": 100, "trainer.valid_every": 50})
    with caplog.at_level("INFO"):
        result = train(cfg, run_dir)
    bleus = validation_bleus(caplog)
    print("validation BLEU:", bleus)
    assert len(bleus) >= 3 and bleus[-1] > bleus[0] + 20, bleus
    assert result["best_bleu"] == pytest.approx(max(bleus), abs=0.005) and max(bleus) > 30
    assert len(list((run_dir / "validation").glob("step*.hyp"))) == len(bleus)
    for name in ("last.pt", "best.pt"):
        assert (run_dir / "checkpoints" / name).is_file()
    assert (run_dir / "config.yaml").is_file()
    # Every checkpoint is plain data: the weights-only unpickler reads it.
    checkpoint = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert checkpoint["trainer_state"]["step"] == 100
    kept = sorted((run_dir / "checkpoints").glob("step*-bleu*.pt"))
    assert 1 <= len(kept) <= 3


def test_reported_bleu_equals_the_sacrebleu_command(tiny_train_config, tmp_path, caplog):
    run_dir = tmp_path / "run"
    cfg = tiny_train_config()
    with caplog.at_level("INFO"):
        train(cfg, run_dir)
    reported = [r.getMessage() for r in caplog.records if r.getMessage().startswith("validation step 60")]
    assert reported, "no validation log line for step 60"
    bleu = reported[-1].split("BLEU ")[1].split()[0]
    hyp = run_dir / "validation" / "step0000060.hyp"
    command = [str(Path(sys.executable).parent / "sacrebleu"),
               str(tiny_train_config.corpus["valid"][1]),
               "-i", str(hyp), "-b", "-w", "2"]
    printed = subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()
    assert bleu == printed


@pytest.mark.parametrize("each_epoch", [True, False])
def test_valid_each_epoch_false_validates_on_valid_every_alone(tiny_train_config, tmp_path,
                                                               caplog, each_epoch):
    # A GPU preset's epochs take seconds: validating at each epoch's end would cost more than
    # its training. The log line gives the minutes trained (the val curve against time).
    cfg = tiny_train_config(**{"trainer.max_steps": None, "trainer.max_epochs": 3,
                               "trainer.valid_every": None, "trainer.valid_each_epoch": each_epoch})
    with caplog.at_level("INFO"):
        train(cfg, tmp_path / "run")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("validation step")]
    assert len(lines) == (3 if each_epoch else 1), lines  # without: only the final validation
    assert all(re.search(r"after \d+\.\d\d min of training\) ->", line) for line in lines), lines


def test_tensorboard_has_scalars_and_attention_image(tiny_train_config, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    train(tiny_train_config(**{"trainer.valid.attention_plot_index": 0}), run_dir)
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    for name in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_sec",
                 "valid/loss", "valid/ppl", "valid/bleu", "valid/chrf"):
        assert name in scalars, f"{name} missing from {sorted(scalars)}"
    assert "valid/attention" in events.Tags()["images"]


@pytest.mark.slow
def test_kill_and_resume_is_bitwise_identical(tiny_train_config, tmp_path, run_python):
    """SIGKILL after a checkpoint, resume: same parameters as an uninterrupted run.

    The killed and resumed runs are ``train.py`` processes; the uninterrupted one runs in this
    process (one thread, like them) while the resumed one runs, saving a third torch start.
    """
    # last.pt is first written at step 20 (save_every), so the victim dies in epoch 2 (19
    # batches an epoch), before the step-30 validation.
    extra = {"trainer.max_steps": 40}
    common = tiny_train_config.overrides(**extra)
    killed_dir = tmp_path / "killed"
    last = killed_dir / "checkpoints" / "last.pt"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    victim = run_python.start([ROOT / "train.py", *common, f"hydra.run.dir={killed_dir}"],
                              cwd=tmp_path, env=env)
    try:
        deadline = time.time() + 300
        while not last.exists() and victim.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert victim.poll() is None, "the run finished before it could be killed"
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.result()
    killed_at = load_checkpoint(last)["trainer_state"]["step"]
    assert killed_at < 40

    resumed = run_python.start([ROOT / "train.py", *common, f"hydra.run.dir={killed_dir}",
                                "trainer.resume=auto"], cwd=tmp_path, env=env)
    try:
        train(tiny_train_config(**extra), tmp_path / "straight")
        resumed.wait(timeout=300)
    finally:
        resumed.kill()  # a no-op once it has ended
        result = resumed.result()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"resumed from {last} at step {killed_at}" in output

    expected = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")["model"]
    actual = load_checkpoint(last)["model"]
    for name, tensor in expected.items():
        assert torch.equal(tensor, actual[name]), f"{name} differs after resume"


def test_two_runs_with_the_same_seed_give_identical_checkpoints(tiny_train_config, tmp_path):
    """Dropout is torch's own and draws from the seeded generator: the same seed, the same run."""
    overrides = {"trainer.max_steps": 8, "trainer.valid_every": 8, "model.dropout": 0.3,
                 "trainer.valid.max_sentences": 4}
    models = []
    for name in ("first", "second"):
        train(tiny_train_config(**overrides), tmp_path / name)
        models.append(load_checkpoint(tmp_path / name / "checkpoints" / "last.pt")["model"])
    assert models[0].keys() == models[1].keys()
    for key, tensor in models[0].items():
        assert torch.equal(tensor, models[1][key]), f"{key} differs between two seeded runs"


@pytest.mark.slow
def test_compiled_training_matches_eager(tiny_train_config, tmp_path):
    """trainer.compile=true trains through torch.compile (inductor: a C++ compiler on CPUs);
    without dropout its step gives the eager step's weights, up to float rounding. One step:
    the next batch's other shapes would compile the model again, dynamic this time (a minute
    of C++ compiling on two AVX2 cores). Plain SGD at lr 1, so that the step is the gradient
    itself (Adam's first step is about lr times its sign)."""
    overrides = {"trainer.max_steps": 1, "trainer.valid_every": 1, "model.dropout": 0.0,
                 "trainer.valid.max_sentences": 4, "optimizer": "sgd", "optimizer.lr": 1.0,
                 "optimizer.momentum": 0.0, "optimizer.nesterov": False}
    models = []
    for compile_model in (False, True):
        run_dir = tmp_path / f"compile={compile_model}"
        train(tiny_train_config(**overrides, **{"trainer.compile": compile_model}), run_dir)
        models.append(load_checkpoint(run_dir / "checkpoints" / "last.pt")["model"])
    for key, tensor in models[0].items():
        torch.testing.assert_close(models[1][key], tensor, atol=1e-4, rtol=1e-4, msg=key)


def test_resume_with_another_model_shape_says_what_differs(tiny_train_config, tmp_path):
    run_dir = tmp_path / "run"
    train(tiny_train_config(**{"trainer.max_steps": 20}), run_dir)
    cfg = tiny_train_config(**{"model.decoder.hidden_size": 48,
                               "trainer.resume": run_dir / "checkpoints" / "last.pt"})
    with pytest.raises(CheckpointError, match=r"model\.decoder\.hidden_size: 64 -> 48"):
        train(cfg, tmp_path / "other")


@pytest.mark.parametrize("change", ["vocab_size", "corpus"])
def test_resume_with_another_tokenizer_is_refused(tiny_train_config, tmp_path, change):
    """Token ids mean nothing under another sentencepiece model: resuming must stop, saying so."""
    run_dir = tmp_path / "run"
    train(tiny_train_config(**{"trainer.max_steps": 10, "trainer.valid_every": 1000}), run_dir)
    last = run_dir / "checkpoints" / "last.pt"
    before = last.read_bytes()
    if change == "vocab_size":
        extra = {"tokenizer.vocab_size": 50}
        expected = r"tokenizer\.vocab_size: 60 -> 50.*vocabulary"
    else:  # same tokenizer settings, another training corpus: another vocabulary
        words = ["red", "blue", "green", "cat", "dog", "house", "tree", "car", "bird", "fish"]
        other = tmp_path / "other"
        other.mkdir()
        lines = [" ".join(words[(i * 7 + k) % len(words)] for k in range(2 + i % 5))
                 for i in range(600)]
        for side in ("src", "tgt"):
            (other / f"train.{side}").write_text("\n".join(lines) + "\n", encoding="utf-8")
        extra = {"data.train.src": other / "train.src", "data.train.tgt": other / "train.tgt"}
        expected = "vocabulary"
    with pytest.raises(CheckpointError, match=rf"cannot resume from .*last\.pt.*{expected}"):
        train(tiny_train_config(**extra, **{"trainer.resume": "auto"}), run_dir)
    assert last.read_bytes() == before  # refused before anything was written


@pytest.mark.parametrize("patience", [1, 2])
def test_early_stopping_after_patience_validations_without_a_better_bleu(
    tiny_train_config, tmp_path, caplog, patience
):
    """lr 0: the model never changes, so no validation after the first beats the first."""
    run_dir = tmp_path / "run"
    cfg = tiny_train_config(**{
        "optimizer.lr": 0.0, "trainer.max_steps": 100, "trainer.valid_every": 3,
        "trainer.save_every": 1000, "trainer.valid.max_sentences": 8,
        "trainer.early_stopping_patience": patience})
    with caplog.at_level("INFO"):
        result = train(cfg, run_dir)
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")["trainer_state"]
    # The first validation (step 3) sets the best; the patience-th one after it stops training
    # (all within the first epoch of 19 batches, whose end would validate too).
    assert state["step"] == result["steps"] == 3 * (patience + 1)
    assert state["validations_without_improvement"] == patience
    assert state["best_step"] == result["best_step"] == 3
    assert len(validation_bleus(caplog)) == patience + 1
    assert "early stopping" in caplog.text


def test_early_stopping_counts_validations_in_a_row(tiny_train_config, tmp_path,
                                                    fake_validation_bleu, caplog):
    """A better BLEU resets the count: patience 2 stops at the 2nd non-improvement in a row."""
    bleus = [10.0, 9.0, 11.0, 10.0, 10.5, 50.0]
    handed_out = fake_validation_bleu(bleus)
    run_dir = tmp_path / "run"
    cfg = tiny_train_config(**{
        "trainer.max_steps": 100, "trainer.valid_every": 3, "trainer.save_every": 1000,
        "trainer.valid.max_sentences": 8, "trainer.early_stopping_patience": 2})
    with caplog.at_level("INFO"):
        result = train(cfg, run_dir)
    assert handed_out == bleus[:5]
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")["trainer_state"]
    assert state["step"] == result["steps"] == 15  # the 5th validation
    assert (state["best_bleu"], state["best_step"]) == (11.0, 9)
    assert state["validations_without_improvement"] == 2
    assert "early stopping" in caplog.text


def test_resuming_a_run_that_stopped_early_trains_no_further(tiny_train_config, tmp_path,
                                                              caplog):
    """A sweep run again with trainer.resume=auto leaves an early-stopped run as it was."""
    run_dir = tmp_path / "run"
    options = {"optimizer.lr": 0.0, "trainer.max_steps": 100, "trainer.valid_every": 3,
               "trainer.save_every": 1000, "trainer.valid.max_sentences": 8,
               "trainer.early_stopping_patience": 1}
    train(tiny_train_config(**options), run_dir)
    best = run_dir / "checkpoints" / "best.pt"
    stamp = best.stat().st_mtime_ns
    caplog.clear()
    with caplog.at_level("INFO"):
        result = train(tiny_train_config(**options, **{"trainer.resume": "auto"}), run_dir)
    assert result["steps"] == 6 and validation_bleus(caplog) == []
    assert best.stat().st_mtime_ns == stamp


def test_max_time_counts_the_training_time_before_a_resume(tiny_train_config, tmp_path):
    """The train_seconds a checkpoint carries count against trainer.max_time after a resume."""
    run_dir = tmp_path / "run"
    train(tiny_train_config(**{"trainer.max_steps": 20, "trainer.valid_every": 1000}), run_dir)
    last = run_dir / "checkpoints" / "last.pt"
    checkpoint = load_checkpoint(last)
    assert checkpoint["trainer_state"]["step"] == 20
    assert checkpoint["trainer_state"]["train_seconds"] > 0
    control_dir = tmp_path / "control"
    shutil.copytree(run_dir, control_dir)
    checkpoint["trainer_state"]["train_seconds"] = 3600.0  # an hour already spent
    save_checkpoint(checkpoint, last)

    resumed = {"trainer.max_steps": 24, "trainer.max_time": 30, "trainer.valid_every": 1000,
               "trainer.resume": "auto"}
    train(tiny_train_config(**resumed), run_dir)
    state = load_checkpoint(last)["trainer_state"]
    assert state["step"] <= 21  # at most the one group the limit is checked after
    assert state["train_seconds"] >= 3600.0
    # The same resume from the checkpoint as it was (seconds, not minutes, spent) goes on.
    train(tiny_train_config(**resumed), control_dir)
    assert load_checkpoint(control_dir / "checkpoints" / "last.pt")["trainer_state"]["step"] == 24


def test_cosine_decay_spans_a_max_time_budget(tiny_train_config, tmp_path, monkeypatch):
    """scheduler=cosine with only trainer.max_time decays over the minutes of training."""
    from types import SimpleNamespace

    from seq2seq.training import budget as budget_module
    from seq2seq.training import schedulers
    from seq2seq.training import trainer as trainer_module

    clock = iter(range(0, 10**6))  # every clock reading is one second later
    fake_time = SimpleNamespace(perf_counter=lambda: next(clock))
    monkeypatch.setattr(trainer_module, "time", fake_time)
    monkeypatch.setattr(budget_module, "time", fake_time)
    progresses = []
    real_factor = schedulers.CosineSchedule.factor

    def factor(self, step, *, progress=None):
        progresses.append(progress)
        return real_factor(self, step, progress=progress)

    monkeypatch.setattr(schedulers.CosineSchedule, "factor", factor)
    run_dir = tmp_path / "run"
    cfg = tiny_train_config(**{"scheduler": "cosine", "scheduler.warmup_steps": 0,
                               "scheduler.min_factor": 0.01, "trainer.max_steps": "null",
                               "trainer.max_epochs": "null", "trainer.max_time": 1,
                               "trainer.valid_every": 1000, "trainer.save_every": 1000})
    train(cfg, run_dir)
    assert progresses[0] == 0.0 and progresses == sorted(progresses)
    assert 0.9 < progresses[-1] <= 1.0
    checkpoint = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert 10 < checkpoint["trainer_state"]["step"] < 60  # 60 fake seconds, one or more a step
    lr = checkpoint["optimizer"]["param_groups"][0]["lr"]
    assert lr < 0.01 * 0.05  # near min_factor * lr at the end of the budget


def test_nan_loss_is_skipped_counted_and_stops_after_a_streak(tiny_train_config, tmp_path,
                                                              monkeypatch):
    from seq2seq.training import loss as loss_module

    real_forward = loss_module.SequenceLoss.forward
    calls = {"n": 0}

    def sometimes_nan(self, *args):
        loss_sum, nll_sum = real_forward(self, *args)
        calls["n"] += 1
        if self.model.training and (calls["n"] in (5, 6) or calls["n"] >= 30):
            return loss_sum * float("nan"), nll_sum
        return loss_sum, nll_sum

    monkeypatch.setattr(loss_module.SequenceLoss, "forward", sometimes_nan)
    run_dir = tmp_path / "run"
    cfg = tiny_train_config(**{
        "trainer.max_steps": 100, "trainer.valid_every": 1000, "trainer.save_every": 10,
        "trainer.max_consecutive_nonfinite": 3})
    with pytest.raises(TrainingError, match="3 non-finite losses in a row"):
        train(cfg, run_dir)
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")["trainer_state"]
    # Calls 5 and 6 were skipped (no step), then training went on until the streak at 30+.
    assert state["nonfinite_total"] == 2
    assert state["step"] == 20  # the last save before the streak (save_every=10, steps 1..27)
    for tensor in load_checkpoint(run_dir / "checkpoints" / "last.pt")["model"].values():
        assert torch.isfinite(tensor).all()


def validated_steps(caplog) -> list[int]:
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("validation step")]
    return [int(line.split()[2]) for line in lines]


def test_a_skipped_update_does_not_validate_or_save_its_step_again(tiny_train_config, tmp_path,
                                                                   monkeypatch, caplog):
    """The update after the validation of step 3 is NaN: the step stays 3, and step 3 must not
    be validated (or logged, or saved) a second time."""
    from seq2seq.training import loss as loss_module

    real_forward = loss_module.SequenceLoss.forward
    calls = {"n": 0}

    def nan_after_step_3(self, *args):
        loss_sum, nll_sum = real_forward(self, *args)
        if self.model.training:
            calls["n"] += 1
            if calls["n"] == 4:
                return loss_sum * float("nan"), nll_sum
        return loss_sum, nll_sum

    monkeypatch.setattr(loss_module.SequenceLoss, "forward", nan_after_step_3)
    cfg = tiny_train_config(**{
        "trainer.max_steps": 6, "trainer.valid_every": 3, "trainer.save_every": 3,
        "trainer.valid.max_sentences": 8, "trainer.early_stopping_patience": 2})
    with caplog.at_level("INFO"):
        train(cfg, tmp_path / "run")
    assert validated_steps(caplog) == [3, 6]
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["trainer_state"]
    assert state["step"] == 6 and state["nonfinite_total"] == 1
    assert state["validations_without_improvement"] <= 1


def test_resuming_a_finished_run_does_not_validate_its_last_step_again(tiny_train_config,
                                                                        tmp_path, caplog):
    run_dir = tmp_path / "run"
    options = {"trainer.max_steps": 6, "trainer.valid_every": 3, "trainer.valid.max_sentences": 8}
    train(tiny_train_config(**options), run_dir)
    before = load_checkpoint(run_dir / "checkpoints" / "last.pt")["trainer_state"]
    caplog.clear()
    with caplog.at_level("INFO"):
        train(tiny_train_config(**options, **{"trainer.resume": "auto"}), run_dir)
    assert validated_steps(caplog) == []
    after = load_checkpoint(run_dir / "checkpoints" / "last.pt")["trainer_state"]
    assert after["validations_without_improvement"] == before["validations_without_improvement"]
    assert after["best_checkpoints"] == before["best_checkpoints"]


def test_unknown_config_key_is_one_line(tmp_path, run_python):
    result = run_python([ROOT / "train.py", "trainer.no_such_key=1"], cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: trainer.no_such_key is not an option; --help lists them"]


@pytest.mark.parametrize(("override", "message"), [
    ("optimizer.lr=abc", "optimizer.lr: expected a number, got 'abc'"),
    ("trainer.max_steps=ten", "trainer.max_steps: expected an integer, got 'ten'"),
    ("model.attention.hidden_size=big", "model.attention.hidden_size: expected an integer"),
    ("trainer.precision=fp8", "trainer.precision must be one of auto, fp32, bf16, fp16"),
    ("trainer.average_last=1", "trainer.average_last must be at least 2 (or null), got 1"),
    ("trainer.average_last=abc", "trainer.average_last: expected an integer, got 'abc'"),
])
def test_bad_config_value_is_refused_naming_the_key(tiny_train_config, tmp_path, override,
                                                    message):
    """What train.py prints as its one ERROR line (the first line of this error)."""
    from seq2seq.config_types import error_reason

    key, value = override.split("=", 1)
    cfg = tiny_train_config(**{key: value})
    with pytest.raises(ValueError) as raised:
        train(cfg, tmp_path / "run")
    assert message in error_reason(raised.value)
    assert not (tmp_path / "data").exists() and not (tmp_path / "run").exists()


def test_bad_config_value_is_one_line_error_from_train_py(tmp_path, run_python):
    result = run_python([ROOT / "train.py", "optimizer.lr=abc"], cwd=tmp_path, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert result.stderr.strip().splitlines() == ["error: optimizer.lr: expected a number, got 'abc'"]
    assert "Traceback" not in output
    assert not (tmp_path / "data").exists()  # stopped before fetching or preparing anything
    assert not (tmp_path / "outputs").exists()  # nor a run folder left behind


@pytest.mark.parametrize("argv", [
    ["model/attention=null"], ["trainer.seed=1", "+model/attention=NULL"],
    ["-m", "model/attention=dot,null"]])
def test_group_set_to_null_on_the_command_line_is_one_line_error(monkeypatch, capsys, argv):
    """Hydra stops on ``group=null`` with its own traceback; train.py names the fix first."""
    from seq2seq.cli import train as train_cli

    monkeypatch.setattr(sys, "argv", ["train.py", *argv])
    monkeypatch.setattr(train_cli.train_main, "task", lambda: pytest.fail("Hydra was reached"))
    with pytest.raises(SystemExit) as raised:
        train_cli.main()
    assert raised.value.code == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: model/attention=null: a config group cannot be set to null on the command "
        "line; remove it with ~model/attention"]


def test_other_overrides_reach_hydra(monkeypatch):
    """Keys and values that are not a group set to null pass the check untouched."""
    from seq2seq.cli.common import check_group_overrides

    check_group_overrides(["~model/attention", "model/attention=dot", "trainer.seed=null",
                           "data.test.src=null", "--cfg", "job", "hydra/launcher=joblib",
                           "model/attention='null'"])


@pytest.mark.slow
def test_two_process_gloo_torchrun_keeps_ranks_identical(tiny_train_config, tmp_path):
    """Two gloo ranks accumulating 4 batches a step, over 2 epochs whose batch count per rank
    leaves a partial group (which must synchronise the ranks too): the run's own check finds
    identical parameters on both ranks, and rank 0 alone logs, writes checkpoints and averages
    the last 2 validations. One run for both, as each torchrun costs three torch imports."""
    run_dir = tmp_path / "ddp"
    overrides = tiny_train_config.overrides(**{
        "trainer.max_epochs": 2, "trainer.max_steps": "null", "trainer.accumulate_grad_batches": 4,
        "trainer.valid_every": 2, "trainer.average_last": 2})
    # A rank that crashes prints every thread's Python stack.
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", str(ROOT / "train.py"), *overrides, f"hydra.run.dir={run_dir}"]
    with subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as process:
        try:  # about 10 s alone
            stdout, stderr = process.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            # A hang: SIGABRT has faulthandler print where each rank's threads wait, for the
            # failure message (torchrun starts the ranks in sessions of their own).
            children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text()
            for pid in (*map(int, children.split()), process.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGABRT)
            stdout, stderr = process.communicate(timeout=60)
            pytest.fail(f"torchrun hung; its output and stacks:\n{(stdout + stderr)[-8000:]}")
    output = stdout + stderr
    assert process.returncode == 0, output[-3000:]
    assert "parameters identical on all 2 ranks" in output
    log_text = (run_dir / "train.log").read_text()
    batches = int(re.search(r"training: (\d+) batches per epoch per rank", log_text).group(1))
    assert batches % 4 != 0, f"{batches} batches per rank: no partial group, the test proves nothing"
    assert "rank 0 of 2 joined the gloo process group" in log_text
    # Only rank 0 logs to the file and writes checkpoints.
    assert "rank 1 of 2" not in log_text
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("*.pt"))[:2] == [
        "averaged.pt", "best.pt"]
    # Rank 0 alone averaged the last 2 validations and validated the average; rank 1 waited.
    assert "averaged last 2: BLEU" in log_text
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")["trainer_state"]
    steps = 2 * math.ceil(batches / 4)  # the partial group is a step of its own
    assert state["epoch"] == 2 and state["step"] == steps
    averaged_from = load_checkpoint(run_dir / "checkpoints" / "averaged.pt")["averaged_from"]
    assert averaged_from == state["recent_checkpoints"]  # the last 2 validations (epoch ends too)
    assert len(averaged_from) == 2 and averaged_from[-1] == f"recent/step{steps:07d}.pt"


def test_auto_precision_trains_in_fp32_where_bf16_is_emulated_and_bf16_warns(
        tiny_train_config, tmp_path, monkeypatch, caplog):
    """Where bf16 is emulated, auto trains in fp32 and a pinned bf16 warns; the run's
    config.yaml and checkpoints record what trained beside what was asked (compare.py groups
    runs by it)."""
    import yaml

    import seq2seq.device
    from seq2seq.precision import CpuPrecision

    monkeypatch.setattr(seq2seq.device, "onednn_half_precision_kernels",
                        lambda: {"bf16": False, "fp16": False})
    monkeypatch.setattr(seq2seq.device, "choose_cpu_precision", lambda workload: CpuPrecision(
        "fp32", 0.25, "2026-11-27", from_cache=True, probe_seconds=None, cache_path=None,
        cache_error="test"))  # the probe's verdict on an emulated bf16, without timing
    monkeypatch.setattr(seq2seq.device, "_WARNED", set())
    for precision in ("auto", "bf16"):
        cfg = tiny_train_config(**{"trainer.precision": precision, "trainer.max_steps": 1,
                                   "trainer.valid_every": "null", "trainer.max_epochs": 1})
        caplog.clear()
        with caplog.at_level("INFO"):
            train(cfg, tmp_path / precision)
        messages = [record.getMessage() for record in caplog.records]
        warning = seq2seq.device.half_precision_warning("bf16", torch.device("cpu")).replace(
            "precision=", "trainer.precision=")
        if precision == "auto":
            assert any(message.startswith("trainer.precision=auto -> fp32 (bf16 0.25x fp32 on "
                                          "this CPU") and "emulated" in message
                       for message in messages)
            assert warning not in messages
        else:
            assert warning in messages
            assert "use trainer.precision=fp32 or trainer.precision=auto" in warning
        trained = {"auto": "fp32", "bf16": "bf16"}[precision]
        recorded = yaml.safe_load((tmp_path / precision / "config.yaml").read_text())
        checkpoint = load_checkpoint(tmp_path / precision / "checkpoints" / "last.pt")
        for config in (recorded, checkpoint["config"]):
            assert config["trainer"]["precision"] == precision
            assert config["trained_precision"] == trained


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_path_runs_on_cpu(tiny_train_config, tmp_path, precision):
    """autocast + grad scaler, the code path GPUs take, exercised on the CPU."""
    run_dir = tmp_path / "run"
    cfg = tiny_train_config(**{
        "trainer.precision": precision, "trainer.max_steps": 6, "trainer.valid_every": 6,
        "trainer.valid.max_sentences": 8})
    result = train(cfg, run_dir)
    checkpoint = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert checkpoint["trainer_state"]["step"] == 6 and result["best_bleu"] >= 0
    assert bool(checkpoint["scaler"]) == (precision == "fp16")  # the scaler's state is saved
    for tensor in checkpoint["model"].values():
        assert tensor.dtype == torch.float32 and torch.isfinite(tensor).all()


# The installed wheel's scripts are all run by test_packaging.py; this is the editable install
# `make install` makes.
@pytest.mark.parametrize("script", ["seq2seq-train"])
def test_console_scripts_find_their_configs_from_any_folder(tmp_path, script):
    executable = Path(sys.executable).parent / script
    if not executable.exists():
        pytest.skip(f"{script} is not installed (pip install -e . installs it)")
    result = subprocess.run([str(executable), "--cfg", "job"], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "Primary config" not in result.stderr
