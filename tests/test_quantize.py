"""quantize=int8: dynamic int8 quantization for CPU decoding (seq2seq/inference/quantize.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from seq2seq.checkpoint import load_checkpoint, model_from_checkpoint
from seq2seq.inference.quantize import quantize_for_cpu
from seq2seq.inference.translator import Translator

ROOT = Path(__file__).resolve().parents[1]


def _quantized_types():
    from torch.ao.nn.quantized.dynamic import GRU, LSTM, Linear

    return GRU, LSTM, Linear


@pytest.fixture(scope="module")
def float_model(trained_checkpoint):
    model, tokenizers, _ = model_from_checkpoint(load_checkpoint(trained_checkpoint), "cpu")
    return model.eval(), tokenizers


def test_quantize_dynamic_is_still_in_this_pytorch():
    """The API is deprecated (see seq2seq/inference/quantize.py); this fails when it is gone."""
    try:
        from torch.ao.quantization import quantize_dynamic  # noqa: F401
    except ImportError as error:  # pragma: no cover - only on a PyTorch that dropped it
        pytest.fail(
            f"torch {torch.__version__} has no torch.ao.quantization.quantize_dynamic any more: "
            f"quantize=int8 no longer works; port seq2seq/inference/quantize.py ({error})"
        )


def test_int8_replaces_rnn_and_linear_modules_and_leaves_the_original(float_model):
    model, _ = float_model
    q_gru, q_lstm, q_linear = _quantized_types()
    quantized = quantize_for_cpu(model, "int8")
    assert quantized is not model
    types = [type(m) for m in quantized.modules()]
    assert nn.Linear not in types and nn.GRU not in types and nn.LSTM not in types
    assert type(quantized.encoder.rnn) is q_gru and type(quantized.decoder.rnn) is q_gru
    assert type(quantized.generator) is q_linear
    assert type(quantized.decoder.attention.scorer.query_proj) is q_linear
    assert type(quantized.encoder.embedding) is nn.Embedding  # stays float (documented)
    # The float model is untouched.
    assert type(model.generator) is nn.Linear and type(model.encoder.rnn) is nn.GRU
    assert quantize_for_cpu(model, "none") is model


@pytest.mark.parametrize("beam_size", [1, 5])
def test_int8_decoding_matches_fp32_on_most_sentences(float_model, copy_sentences, beam_size):
    model, tokenizers = float_model
    sentences = copy_sentences(30, seed=11)
    fp32 = Translator(model, tokenizers, device="cpu", beam_size=beam_size)
    int8 = Translator(model, tokenizers, device="cpu", beam_size=beam_size, quantize="int8")
    assert type(int8.model.generator) is _quantized_types()[2]
    expected = [n_best[0].text for n_best in fp32.translate(sentences, return_attention=False)]
    with torch.inference_mode():
        results = int8.translate(sentences + [""], return_attention=True)
    got = [n_best[0].text for n_best in results[:-1]]
    same = sum(a == b for a, b in zip(expected, got, strict=True))
    assert same >= 24, f"only {same}/30 int8 translations equal the fp32 ones"
    assert sum(a == s for a, s in zip(got, sentences, strict=True)) >= 24  # it still copies
    assert results[-1][0].text == ""
    best = results[0][0]
    assert best.attention is not None and torch.isfinite(best.attention).all()
    assert best.attention.shape == (len(best.target_pieces) + 1, len(best.source_pieces) + 1)


@pytest.mark.parametrize(("rnn_type", "decoder", "scorer"), [
    ("lstm", "LuongDecoder", {"_target_": "seq2seq.models.attention.GeneralScorer"}),
    ("lstm", "BahdanauDecoder", {"_target_": "seq2seq.models.attention.LocationScorer"}),
    ("gru", "LuongDecoder", {"_target_": "seq2seq.models.attention.GaussianScorer"}),
])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_int8_other_architectures_decode(rnn_type, decoder, scorer, autocast):
    # quantize=int8 with precision=bf16: the float parts run under autocast, the quantized
    # RNNs take float32 inputs only (the decoder must not cast their input to bf16).
    from seq2seq.inference.search import beam_search, greedy_search
    from seq2seq.models.build import build_model

    torch.manual_seed(0)
    config = {
        "embed_dim": 16, "dropout": 0.0, "tie_embeddings": decoder == "LuongDecoder",
        "encoder": {"_target_": "seq2seq.models.encoder.RNNEncoder", "rnn_type": rnn_type,
                    "embed_dim": 16, "hidden_size": 8, "num_layers": 2,
                    "bidirectional": True, "dropout": 0.0},
        "decoder": {"_target_": f"seq2seq.models.decoders.{decoder}", "rnn_type": rnn_type,
                    "embed_dim": 16, "hidden_size": 16, "num_layers": 2, "dropout": 0.0,
                    "bridge": True, "output_dim": None},
        "attention": scorer,
    }
    if decoder == "LuongDecoder":
        config["decoder"]["input_feeding"] = True
    model = build_model(config, src_vocab_size=20, tgt_vocab_size=20).eval()
    quantized = quantize_for_cpu(model, "int8")
    q_gru, q_lstm, _ = _quantized_types()
    assert type(quantized.encoder.rnn) is (q_lstm if rnn_type == "lstm" else q_gru)
    assert type(quantized.decoder.rnn) is (q_lstm if rnn_type == "lstm" else q_gru)
    src = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]])
    lengths = torch.tensor([5, 3])
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        greedy = greedy_search(quantized, src, lengths, max_len_a=1.0, max_len_b=3,
                               length_penalty=1.0, return_attention=True)
        beams = beam_search(quantized, src, lengths, beam_size=3, nbest=2, max_len_a=1.0,
                            max_len_b=3, length_penalty=1.0, return_attention=False)
    assert len(greedy) == len(beams) == 2
    assert all(len(n_best) == 2 for n_best in beams)


def test_bad_mode_and_non_cpu_device_are_value_errors(float_model):
    model, tokenizers = float_model
    with pytest.raises(ValueError, match="quantize must be one of none, int8, got 'int4'"):
        quantize_for_cpu(model, "int4")
    with pytest.raises(ValueError, match="runs on the CPU only"):
        quantize_for_cpu(model, "int8", "cuda")
    with pytest.raises(ValueError, match="quantize must be one of"):
        Translator(model, tokenizers, device="cpu", quantize="fp8")


# -- the command-line tools ------------------------------------------------------------------
@pytest.fixture
def workdir(tmp_path, trained_checkpoint) -> Path:
    shutil.copytree(trained_checkpoint.parents[1] / "corpus", tmp_path / "corpus")
    return tmp_path


def test_translate_py_int8_prints_translations(run_tool, workdir, trained_checkpoint, copy_sentences):
    lines = copy_sentences(5, seed=3)
    result = run_tool([str(ROOT / "translate.py"), f"checkpoint={trained_checkpoint}",
                       "device=cpu", "quantize=int8", "beam_size=3"],
                      cwd=workdir, stdin="".join(f"{line}\n" for line in lines))
    assert result.returncode == 0, result.stderr
    output = result.stdout.splitlines()
    assert len(output) == len(lines)
    assert sum(a == b for a, b in zip(output, lines, strict=True)) >= 4
    assert "Warning" not in result.stderr  # the API's deprecation warnings are silenced


@pytest.mark.parametrize(("override", "message"), [
    ("quantize=int4", "quantize must be one of none, int8, got 'int4'"),
    ("quantize=8", "quantize: expected a string"),
])
def test_translate_py_bad_quantize_is_one_line_error(run_tool, workdir, trained_checkpoint, override,
                                                      message):
    result = run_tool([str(ROOT / "translate.py"), f"checkpoint={trained_checkpoint}",
                       "device=cpu", override], cwd=workdir, stdin="red cat\n")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: {message}")
    assert result.stderr.count("\n") == 1


def test_evaluate_py_int8_records_it(run_tool, workdir, trained_checkpoint):
    result = run_tool([str(ROOT / "evaluate.py"), f"checkpoint={trained_checkpoint}",
                       "device=cpu", "quantize=int8", "beam_size=2", "src=corpus/test.src",
                       "ref=corpus/test.tgt", "output_dir=eval"], cwd=workdir)
    assert result.returncode == 0, result.stderr
    summary = json.loads(next((workdir / "eval").glob("*.json")).read_text())
    assert summary["quantize"] == "int8" and summary["bleu"] > 50


def test_serve_builds_int8_translators(trained_checkpoint):
    pytest.importorskip("fastapi")
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from seq2seq import CONFIG_DIR
    from seq2seq.cli.serve import build_app
    from seq2seq.serving.models import load_model

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="serve", overrides=[f"checkpoint={trained_checkpoint}",
                                                      "device=cpu", "quantize=int8"])
    assert build_app(cfg) is not None
    served = load_model(trained_checkpoint, device="cpu", quantize="int8")
    assert type(served.translator.model.generator) is _quantized_types()[2]
    assert served.parameters == load_model(trained_checkpoint, device="cpu").parameters
