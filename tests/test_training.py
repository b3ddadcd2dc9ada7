"""End-to-end training on a tiny synthetic task: BLEU, checkpoints, resume, TensorBoard, NaN."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from seq2seq import CONFIG_DIR
from seq2seq.checkpoint import CheckpointError, load_checkpoint
from seq2seq.training.run import train
from seq2seq.training.trainer import TrainingError

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = CONFIG_DIR

WORDS = ["ka", "lo", "mi", "nu", "pe", "ra", "si", "to", "ve", "zu", "bar", "den"]
# A word-for-word "language": each source word has one target word, same order.
LEXICON = {w: w[::-1].upper() + "x" for w in WORDS}


def write_corpus(directory: Path, name: str, count: int, seed: int) -> tuple[Path, Path]:
    rng = random.Random(seed)
    sources, targets = [], []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 6))]
        sources.append(" ".join(words))
        targets.append(" ".join(LEXICON[w] for w in words))
    src, tgt = directory / f"{name}.src", directory / f"{name}.tgt"
    src.write_text("\n".join(sources) + "\n", encoding="utf-8")
    tgt.write_text("\n".join(targets) + "\n", encoding="utf-8")
    return src, tgt


@pytest.fixture
def corpus(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    directory = tmp_path / "corpus"
    directory.mkdir()
    return {
        "train": write_corpus(directory, "train", 600, seed=1),
        "valid": write_corpus(directory, "valid", 40, seed=2),
    }


def tiny_overrides(corpus, tmp_path: Path, **extra) -> list[str]:
    """Shrink the real config to a run of seconds on the CPU."""
    overrides = {
        "data": "files",
        "data.train.src": corpus["train"][0],
        "data.train.tgt": corpus["train"][1],
        "data.valid.src": corpus["valid"][0],
        "data.valid.tgt": corpus["valid"][1],
        "paths.data_dir": tmp_path / "data",
        "tokenizer.vocab_size": 60,
        "model.embed_dim": 32,
        "model.dropout": 0.1,
        "model.encoder.hidden_size": 32,
        "model.decoder.hidden_size": 64,
        "batch.max_tokens": 400,
        "trainer.num_threads": 1,
        "trainer.max_epochs": 100,
        "trainer.max_steps": 60,
        "trainer.log_every": 20,
        "trainer.valid_every": 30,
        "trainer.save_every": 20,
        "trainer.progress_bar": False,
        "optimizer.lr": 0.01,
    }
    overrides.update(extra)
    return [f"{key}={value}" for key, value in overrides.items()]


def compose_config(overrides: list[str]):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def validation_bleus(caplog) -> list[float]:
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("validation step")]
    return [float(line.split("BLEU ")[1].split()[0]) for line in lines]


def test_training_improves_validation_bleu_and_writes_the_run_folder(corpus, tmp_path, caplog):
    run_dir = tmp_path / "run"
    cfg = compose_config(tiny_overrides(corpus, tmp_path, **{"trainer.max_steps": 150,
                                                               "trainer.valid_every": 50}))
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
    assert checkpoint["trainer_state"]["step"] == 150
    kept = sorted((run_dir / "checkpoints").glob("step*-bleu*.pt"))
    assert 1 <= len(kept) <= 3


def test_reported_bleu_equals_the_sacrebleu_command(corpus, tmp_path, caplog):
    run_dir = tmp_path / "run"
    cfg = compose_config(tiny_overrides(corpus, tmp_path))
    with caplog.at_level("INFO"):
        train(cfg, run_dir)
    reported = [r.getMessage() for r in caplog.records if r.getMessage().startswith("validation step 60")]
    assert reported, "no validation log line for step 60"
    bleu = reported[-1].split("BLEU ")[1].split()[0]
    hyp = run_dir / "validation" / "step0000060.hyp"
    command = [str(Path(sys.executable).parent / "sacrebleu"), str(corpus["valid"][1]),
               "-i", str(hyp), "-b", "-w", "2"]
    printed = subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()
    assert bleu == printed


def test_tensorboard_has_scalars_and_attention_image(corpus, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    train(compose_config(tiny_overrides(corpus, tmp_path)), run_dir)
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    for name in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_sec",
                 "valid/loss", "valid/ppl", "valid/bleu", "valid/chrf"):
        assert name in scalars, f"{name} missing from {sorted(scalars)}"
    assert "valid/attention" in events.Tags()["images"]


def run_cli(overrides: list[str], cwd: Path, **kwargs) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), *overrides], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs)


@pytest.mark.slow
def test_kill_and_resume_is_bitwise_identical(corpus, tmp_path):
    """SIGKILL after a checkpoint, resume: same parameters as an uninterrupted run."""
    common = tiny_overrides(corpus, tmp_path, **{"trainer.max_steps": 80,
                                                 "trainer.valid_every": 50})
    straight_dir, killed_dir = tmp_path / "straight", tmp_path / "killed"
    straight = run_cli([*common, f"hydra.run.dir={straight_dir}"], tmp_path)
    assert straight.wait(timeout=300) == 0, straight.stdout.read().decode()

    last = killed_dir / "checkpoints" / "last.pt"
    victim = run_cli([*common, f"hydra.run.dir={killed_dir}"], tmp_path)
    deadline = time.time() + 300
    while not last.exists() and victim.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert victim.poll() is None, "the run finished before it could be killed"
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed_at = load_checkpoint(last)["trainer_state"]["step"]
    assert killed_at < 80

    resumed = run_cli([*common, f"hydra.run.dir={killed_dir}", "trainer.resume=auto"], tmp_path)
    output = resumed.communicate(timeout=300)[0].decode()
    assert resumed.returncode == 0, output
    assert f"resumed from {last} at step {killed_at}" in output

    expected = load_checkpoint(straight_dir / "checkpoints" / "last.pt")["model"]
    actual = load_checkpoint(last)["model"]
    for name, tensor in expected.items():
        assert torch.equal(tensor, actual[name]), f"{name} differs after resume"


def test_resume_with_another_model_shape_says_what_differs(corpus, tmp_path):
    run_dir = tmp_path / "run"
    train(compose_config(tiny_overrides(corpus, tmp_path, **{"trainer.max_steps": 20})), run_dir)
    cfg = compose_config(tiny_overrides(corpus, tmp_path, **{
        "model.decoder.hidden_size": 48, "trainer.resume": run_dir / "checkpoints" / "last.pt"}))
    with pytest.raises(CheckpointError, match=r"model\.decoder\.hidden_size: 64 -> 48"):
        train(cfg, tmp_path / "other")


def test_nan_loss_is_skipped_counted_and_stops_after_a_streak(corpus, tmp_path, monkeypatch):
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
    cfg = compose_config(tiny_overrides(corpus, tmp_path, **{
        "trainer.max_steps": 100, "trainer.valid_every": 1000, "trainer.save_every": 10,
        "trainer.max_consecutive_nonfinite": 3}))
    with pytest.raises(TrainingError, match="3 non-finite losses in a row"):
        train(cfg, run_dir)
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")["trainer_state"]
    # Calls 5 and 6 were skipped (no step), then training went on until the streak at 30+.
    assert state["nonfinite_total"] == 2
    assert state["step"] == 20  # the last save before the streak (save_every=10, steps 1..27)
    for tensor in load_checkpoint(run_dir / "checkpoints" / "last.pt")["model"].values():
        assert torch.isfinite(tensor).all()


def test_unknown_config_key_fails_with_hydras_message(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), "trainer.no_such_key=1"],
                            cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode != 0
    assert "Could not override 'trainer.no_such_key'" in result.stderr
    assert "Traceback" not in result.stderr


def test_print_composed_config(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), "--cfg", "job",
                             "model/attention=dot"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "_target_: seq2seq.models.attention.DotScorer" in result.stdout


@pytest.mark.slow
def test_two_process_gloo_torchrun_keeps_ranks_identical(corpus, tmp_path):
    run_dir = tmp_path / "ddp"
    overrides = tiny_overrides(corpus, tmp_path, **{"trainer.max_steps": 20,
                                                    "trainer.valid_every": 10})
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", str(ROOT / "train.py"), *overrides, f"hydra.run.dir={run_dir}"]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "parameters identical on all 2 ranks" in output
    assert "rank 0 of 2 joined the gloo process group" in (run_dir / "train.log").read_text()
    # Only rank 0 logs to the file and writes checkpoints.
    log_text = (run_dir / "train.log").read_text()
    assert "rank 1 of 2" not in log_text
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("*.pt"))[0] == "best.pt"
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")["trainer_state"]
    assert state["step"] == 20


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_path_runs_on_cpu(corpus, tmp_path, precision):
    """autocast + grad scaler, the code path GPUs take, exercised on the CPU."""
    run_dir = tmp_path / "run"
    cfg = compose_config(tiny_overrides(corpus, tmp_path, **{
        "trainer.precision": precision, "trainer.max_steps": 6, "trainer.valid_every": 6,
        "trainer.valid.max_sentences": 8}))
    result = train(cfg, run_dir)
    checkpoint = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert checkpoint["trainer_state"]["step"] == 6 and result["best_bleu"] >= 0
    assert bool(checkpoint["scaler"]) == (precision == "fp16")  # the scaler's state is saved
    for tensor in checkpoint["model"].values():
        assert tensor.dtype == torch.float32 and torch.isfinite(tensor).all()


@pytest.mark.parametrize("script", ["seq2seq-train", "seq2seq-prepare-data", "seq2seq-evaluate",
                                    "seq2seq-translate"])
def test_console_scripts_find_their_configs_from_any_folder(tmp_path, script):
    executable = Path(sys.executable).parent / script
    if not executable.exists():
        pytest.skip(f"{script} is not installed (pip install -e . installs it)")
    result = subprocess.run([str(executable), "--cfg", "job"], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "Primary config" not in result.stderr
