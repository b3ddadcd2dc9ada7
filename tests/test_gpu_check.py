"""scripts/gpu_check.sh: its CPU dry run, and the tests it runs on a GPU (``-k cuda``).

The ``cuda`` tests skip without a CUDA GPU; on one they train in bf16 and fp16, check that a
checkpoint written there decodes on the CPU, and that greedy and beam search give the CPU's
translations. ``scripts/gpu_check.sh`` runs them as its first step.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seq2seq.checkpoint import load_checkpoint
from seq2seq.device import decide_precision
from seq2seq.inference.decode_options import DecodeOptions
from seq2seq.inference.runtimes import load_translator

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
MULTI30K_FILES = [f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr")
                  for lang in ("de", "en")]

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def multi30k_folder() -> Path | None:
    """Where the dry run finds the Multi30k files, as the script looks for them."""
    url = os.environ.get("SEQ2SEQ_MULTI30K_URL", "").removeprefix("file://")
    for folder in (Path(url) if url else None, ROOT / "data" / "multi30k"):
        if folder is not None and all((folder / name).is_file() for name in MULTI30K_FILES):
            return folder
    return None


@pytest.mark.slow
@pytest.mark.integration
def test_gpu_check_dry_run_reports_every_step(tmp_path):
    """The whole check on the CPU at tiny sizes: every step's result line says ok, and the
    summary table has a row for each."""
    if multi30k_folder() is None:
        pytest.skip("no Multi30k files (SEQ2SEQ_MULTI30K_URL or data/multi30k)")
    out, work = tmp_path / "out", tmp_path / "work"
    env = dict(os.environ, GPU_CHECK_DIR=str(out), GPU_CHECK_WORK=str(work), OMP_NUM_THREADS="1")
    env.pop("OUT", None)
    env.pop("DRY_RUN", None)
    env.setdefault("PYTHON", sys.executable)
    result = subprocess.run(["bash", str(SCRIPT), "--dry-run"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    names = ["setup", "tests", "train", "beam", "torchrun", "resume"]
    for number, name in enumerate(names):
        assert re.search(rf"^RESULT \[{number}/5\] {name}: ok: ", output, re.MULTILINE), output[-4000:]
    assert "0 passed" not in output and re.search(r"RESULT \[1/5\] tests: ok: \d+ skipped", output)
    assert re.search(r"RESULT \[2/5\] train: ok: [\d,]+ target tok/s .* best val BLEU \(greedy\) "
                     r"[\d.]+ at step \d+ \(12 steps in .*val BLEU@minutes: [\d.]+@[\d.]+ [\d.]+@[\d.]+; "
                     r"the CPU preset multi30k_transformer on this device: [\d,]+ target tok/s, "
                     r"best val BLEU \(greedy\) [\d.]+ at step \d+ \(12 steps in .*val BLEU@minutes: "
                     r"[\d.]+@[\d.]+ [\d.]+@[\d.]+; the GPU preset above it at every minute: "
                     r"no whole minute", output)
    assert re.search(r"RESULT \[3/5\] beam: ok: [\d.]+ sentences/s, BLEU [\d.]+", output)
    assert "rank 0 of 1 joined the gloo process group, DDP, 8 steps" in output
    assert "stopped at step 4, resumed at step 4, ended at step 8" in output
    summary = (out / "summary.md").read_text()
    rows = [line for line in summary.splitlines() if re.match(r"\| \d ", line)]
    assert [row.split()[2] for row in rows] == names
    assert all(" | ok: " in row for row in rows)
    assert (out / "gpu_check.log").read_text().count("RESULT [") == 6


# -- the tests the check runs on a GPU ------------------------------------------------------
@needs_cuda
def test_cuda_auto_precision_is_bf16_from_ampere_on():
    major, _ = torch.cuda.get_device_capability(0)
    assert decide_precision("auto", torch.device("cuda", 0))[0] == (
        "bf16" if major >= 8 else "fp32")


@needs_cuda
@pytest.mark.parametrize(("model", "precision"), [("rnn", "bf16"), ("rnn", "fp16"),
                                                  ("transformer", "bf16")])
def test_cuda_training_in_half_precision_writes_a_checkpoint_the_cpu_reads(
        tiny_train_config, tmp_path, model, precision):
    """autocast (and fp16's grad scaler) on the GPU: finite fp32 weights that load and translate
    on the CPU."""
    # Imported here, not at collection: it brings torch._dynamo (seconds), which the check's
    # step 1 would pay also where every test here skips.
    from seq2seq.training.run import train

    transformer = {"model/encoder": "transformer", "model/decoder": "transformer",
                   "model.encoder.hidden_size": None, "model.decoder.hidden_size": None,
                   "model.encoder.num_layers": 1, "model.decoder.num_layers": 1,
                   "model.encoder.ffn_dim": 64, "model.decoder.ffn_dim": 64,
                   "optimizer.lr": 0.003} if model == "transformer" else {}
    run_dir = tmp_path / "run"
    cfg = tiny_train_config(**transformer, **{
        "trainer.device": "cuda", "trainer.precision": precision, "trainer.max_steps": 12,
        "trainer.valid_every": 6, "trainer.valid.max_sentences": 8})
    result = train(cfg, run_dir)
    checkpoint = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert checkpoint["trainer_state"]["step"] == 12 and result["best_bleu"] >= 0
    assert bool(checkpoint["scaler"]) == (precision == "fp16")
    for tensor in checkpoint["model"].values():
        assert tensor.device.type == "cpu"
        assert tensor.dtype == torch.float32 and torch.isfinite(tensor).all()
    translator = load_translator(run_dir / "checkpoints" / "last.pt", device="cpu")
    assert len(translator.translate(["ka lo mi"])) == 1


@needs_cuda
def test_cuda_attention_runs_without_cudnns_plan_per_shape():
    """speed_up's attention on the GPU: the memory-efficient kernel, not cuDNN's, which builds a
    plan for each new shape (a median of 179 ms a call on an H200, docs/results.md#gpu-check),
    also where the caller prefers cuDNN's and the plain model takes it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    from seq2seq.models.transformer import MultiHeadAttention
    from seq2seq.ops import speed_up

    def attention_kernels(attention) -> set[str]:
        x = torch.randn(6, 7, 256, device="cuda", requires_grad=True)
        mask = torch.ones(6, 7, dtype=torch.bool, device="cuda")
        mask[1::2, 5:] = False
        with profile(activities=[ProfilerActivity.CPU]) as profiler, \
                torch.autocast("cuda", dtype=torch.bfloat16), \
                sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION],
                            set_priority=True):
            output, _ = attention(x, *attention.project_keys_values(x), mask)
            output.float().sum().backward()
        return {event.key for event in profiler.key_averages() if "_attention" in event.key}

    plain = MultiHeadAttention(d_model=256, num_heads=4, dropout=0.1).cuda().train()
    if not any("cudnn_attention" in name for name in attention_kernels(plain)):
        pytest.skip("cuDNN's attention does not take these inputs on this GPU")
    swapped = attention_kernels(speed_up(plain))
    assert any("_efficient_attention" in name for name in swapped), sorted(swapped)
    assert not any("cudnn_attention" in name for name in swapped), sorted(swapped)


def test_the_check_compares_the_curves_at_each_whole_minute():
    """gpu_check.sh's verdict: the last validation at or before each whole minute both runs
    reach; a tie is not above."""
    function = re.search(r"^above_at_every_minute\(\) \{.*?^\}$", SCRIPT.read_text(),
                         re.MULTILINE | re.DOTALL).group(0)

    def verdict(curve: str, other: str) -> str:
        return subprocess.run(["bash", "-c", f'{function}\nabove_at_every_minute "$1" "$2"', "-",
                               curve, other], capture_output=True, text=True,
                              check=True).stdout.strip()

    assert verdict("20@0.5 30@1.0 35@1.9 41@3.0", "18@0.5 29@1.1 33@2.0 39@3.0") == "yes"
    assert verdict("20@0.5 30@1.0 35@1.9 40@3.0", "18@0.5 31@0.9 33@2.0 39@3.0") == \
        "no (minute 1: 30 against 31)"
    assert verdict("30@1.0 35@2.0", "29@1.0 35@2.0") == "no (minute 2: 35 against 35)"
    assert verdict("30@1.0 35@2.0 36@3.0", "29@1.0 34@2.0") == "yes"  # minute 3: one run only
    assert verdict("1@0.01", "2@0.01") == "no whole minute"


@needs_cuda
def test_cuda_resume_continues_from_the_checkpoint(tiny_train_config, tmp_path):
    """trainer.resume=auto on the GPU: the checkpoint is loaded onto the device and its
    tokenizers are compared with the run's (which live on the CPU)."""
    from seq2seq.training.run import train

    run_dir = tmp_path / "run"
    common = {"trainer.device": "cuda", "trainer.valid_every": 6, "trainer.save_every": 6,
              "trainer.valid.max_sentences": 8}
    train(tiny_train_config(**common, **{"trainer.max_steps": 6}), run_dir)
    train(tiny_train_config(**common, **{"trainer.max_steps": 12, "trainer.resume": "auto"}),
          run_dir)
    checkpoint = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert checkpoint["trainer_state"]["step"] == 12


@needs_cuda
@pytest.mark.parametrize("beam_size", [1, 5])
def test_cuda_search_gives_the_cpus_translations(trained_checkpoint, tmp_path, beam_size):
    """The trained copy model (decisive: the same text) and a random Transformer (flat outputs:
    the same tokens, or a near-tie of scores) decode on the GPU as on the CPU, fp32; bf16 on
    the GPU keeps nearly all of the copy model's translations."""
    from conftest import COPY_WORDS, sentences, transformer_checkpoint

    lines = sentences(40, seed=11) + ["", " ".join(COPY_WORDS)]
    options = DecodeOptions(beam_size=beam_size)
    for path in (trained_checkpoint, transformer_checkpoint(tmp_path)):
        results = {}
        for device in ("cpu", "cuda"):
            translator = load_translator(path, device=device)
            results[device] = [n_best[0] for n_best in translator.translate(lines, options)]
        for cpu, gpu in zip(results["cpu"], results["cuda"], strict=True):
            if path == trained_checkpoint:
                assert gpu.text == cpu.text
            else:
                assert gpu.target_pieces == cpu.target_pieces or gpu.score == pytest.approx(
                    cpu.score, abs=1e-3)
    bf16 = load_translator(trained_checkpoint, device="cuda", precision="bf16")
    fp32 = load_translator(trained_checkpoint, device="cuda")
    same = sum(a[0].text == b[0].text for a, b in zip(bf16.translate(lines, options),
                                                       fp32.translate(lines, options),
                                                       strict=True))
    assert same >= 0.9 * len(lines)
