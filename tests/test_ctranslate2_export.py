"""format=ctranslate2: a Transformer converted to CTranslate2 scores and translates as the model.

Every comparison is between implementations on fixed random weights: CTranslate2's greedy
translations and log-probabilities against our search and teacher forcing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

ctranslate2 = pytest.importorskip("ctranslate2")

from conftest import (  # noqa: E402
    copy_tokenizers,
    greedy_search,
    padded_random_sources,
    random_luong_model,
    random_transformer_model,
    transformer_checkpoint,
)

from seq2seq.export.ctranslate2_export import convert_model  # noqa: E402
from seq2seq.export.folder import ExportError  # noqa: E402
from seq2seq.inference.export_format import MANIFEST_NAME  # noqa: E402

VOCAB = 39  # the copy tokenizers' vocabulary


def untied_model(seed: int = 0):
    # Untied and unscaled, a random model's greedy outputs vary from step to step.
    return random_transformer_model(vocab=VOCAB, seed=seed, tie_embeddings=False)


def ct2_greedy(folder: Path, src: torch.Tensor, lengths: torch.Tensor, max_length: int):
    """CTranslate2's greedy translations of padded source ids (ending in EOS), as piece lists,
    with our search's rules: <pad> and <s> never generated, an empty output allowed."""
    tokenizer = copy_tokenizers().src
    sources = [tokenizer.pieces(src[row, : lengths[row] - 1].tolist())  # EOS: add_source_eos
               for row in range(src.size(0))]
    translator = ctranslate2.Translator(str(folder), device="cpu", intra_threads=1)
    results = translator.translate_batch(sources, beam_size=1, max_decoding_length=max_length,
                                         min_decoding_length=0,
                                         suppress_sequences=[["<pad>"], ["<s>"]])
    return [result.hypotheses[0] for result in results]


def test_ctranslate2_translates_as_the_model(tmp_path):
    model = untied_model()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    folder = tmp_path / "ct2"
    manifest = convert_model(model, copy_tokenizers(), {"model": {}}, folder)
    for name, value in model.state_dict().items():  # the conversion leaves the model alone
        assert torch.equal(value, before[name]), name
    assert manifest["format"] == "seq2seq-ctranslate2"
    assert manifest["export"]["largest_log_prob_difference"] < 1e-3
    assert {"model.bin", "config.json", "source.model", MANIFEST_NAME} <= {
        p.name for p in folder.iterdir()}
    src, lengths = padded_random_sources(8, vocab=VOCAB, max_len=10, seed=5)
    want = greedy_search(model, src, lengths, max_len_a=0.0, max_len_b=12.0)
    tokenizer = copy_tokenizers().tgt
    want_pieces = [tokenizer.pieces(best[0].tokens) for best in want]
    assert len({len(pieces) for pieces in want_pieces}) > 2  # outputs of several lengths
    assert ct2_greedy(folder, src, lengths, max_length=12) == want_pieces


def test_int8_conversion_stores_int8_weights_and_leaves_the_model_alone(tmp_path):
    """CTranslate2 quantizes the arrays it is given in place: they must be copies. (A random
    tiny model's int8 log-probabilities are far from its float32 ones, 0.4-2 nats at d_model
    12-64, so closeness is measured on a trained model, in make bench.)"""
    model = untied_model()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    convert_model(model, copy_tokenizers(), {"model": {}}, tmp_path / "fp32")
    manifest = convert_model(model, copy_tokenizers(), {"model": {}}, tmp_path / "int8",
                             quantize="int8")
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert manifest["export"]["quantize"] == "int8"
    assert 0 < manifest["export"]["largest_log_prob_difference"] < 10
    sizes = {name: (tmp_path / name / "model.bin").stat().st_size for name in ("fp32", "int8")}
    assert sizes["int8"] < sizes["fp32"], sizes  # (the position tables stay float32)


def test_an_rnn_model_is_refused_in_one_line(tmp_path):
    model = random_luong_model(vocab=VOCAB)
    with pytest.raises(ExportError, match="format=ctranslate2 converts a Transformer .* "
                                          "export it with format=onnx"):
        convert_model(model, copy_tokenizers(), {"model": {}}, tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists() and not list(tmp_path.iterdir())


def test_a_model_ctranslate2_would_run_differently_is_refused(tmp_path):
    """A change CTranslate2's spec cannot hold (here: a layer norm's epsilon made huge, which
    the spec's one epsilon does not follow) is caught by the scoring check."""
    model = untied_model()
    model.decoder.layers[0].feed_forward_norm.eps = 10.0
    with pytest.raises(ExportError, match="log-probabilities differ from the model's"):
        convert_model(model, copy_tokenizers(), {"model": {}}, tmp_path / "ct2")
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_export_py_converts_a_transformer_checkpoint(tmp_path, run_python):
    from seq2seq.inference.decode_options import DecodeOptions
    from seq2seq.inference.runtimes import load_translator

    checkpoint = transformer_checkpoint(tmp_path)
    output = tmp_path / "ct2"
    root = Path(__file__).resolve().parents[1]
    result = run_python([root / "export.py", f"checkpoint={checkpoint}", f"output={output}",
                         "format=ctranslate2"], cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"decode it with translate.py checkpoint={output}" in result.stderr
    # The Translator on the checkpoint and CTranslate2 on the folder: the same translations.
    lines = ["red cat", "one two big house", "blue bird sun"]
    translator = load_translator(checkpoint, device="cpu")
    greedy = DecodeOptions(beam_size=1, max_len_a=0.0, max_len_b=12.0)
    want = [best[0].target_pieces for best in translator.translate(lines, greedy)]
    tokenizer = copy_tokenizers().src
    ct2 = ctranslate2.Translator(str(output), device="cpu", intra_threads=1)
    got = ct2.translate_batch([tokenizer.pieces(ids) for ids in tokenizer.encode(lines)],
                              beam_size=1, max_decoding_length=12, min_decoding_length=0,
                              suppress_sequences=[["<pad>"], ["<s>"]])
    assert [result.hypotheses[0] for result in got] == want
    # Our tools read the folder too (tests/test_ctranslate2_translator.py: everything else).
    translated = run_python([root / "translate.py", f"checkpoint={output}", "beam_size=1",
                             "max_len_a=0", "max_len_b=12"], input="".join(
                                 f"{line}\n" for line in lines), cwd=tmp_path, timeout=120)
    assert translated.returncode == 0, translated.stderr
    assert translated.stdout.splitlines() == [
        best[0].text for best in translator.translate(lines, greedy)]
