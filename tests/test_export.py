"""Export to ONNX and decoding with ONNX Runtime: the exported graphs decode as the model does.

Every comparison is between implementations on fixed random weights (or the shared copy-task
model): the searches over the exported graphs against the same searches over the PyTorch
model, the server and the command-line tools on an exported folder against the checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnxscript")
onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")

from conftest import (  # noqa: E402
    api_lines,
    assert_same_hypotheses,
    beam_search,
    copy_model_config,
    copy_tokenizers,
    greedy_search,
    made_once,
    padded_random_sources,
    random_luong_model,
    random_transformer_model,
)

from seq2seq.checkpoint import CheckpointError  # noqa: E402
from seq2seq.data.text_files import DataError  # noqa: E402
from seq2seq.export import export_checkpoint  # noqa: E402
from seq2seq.export.folder import ExportError  # noqa: E402
from seq2seq.export.onnx_export import export_model  # noqa: E402
from seq2seq.inference.decode_options import DecodeOptions  # noqa: E402
from seq2seq.inference.ensemble import Ensemble  # noqa: E402
from seq2seq.inference.export_format import ENCODER_FILE, MANIFEST_NAME  # noqa: E402
from seq2seq.inference.model_files import load_model_payload, model_from_payload  # noqa: E402
from seq2seq.inference.onnx_model import OnnxModel  # noqa: E402
from seq2seq.inference.runtimes import load_translator  # noqa: E402
from seq2seq.models.attention import Scorer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 39  # the copy tokenizers' vocabulary: a folder carries them with the graphs
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
LINES = ["red cat", "", "one two big house", "blue bird sun", "moon", "small tree green dog"]
SEARCH = {"max_len_a": 1.0, "max_len_b": 5.0}

# Every scorer (scaled_dot as the multi-head scorer's inner one), every (encoder RNN, decoder)
# pair, softmax and sparsemax, one and two layers, one and two directions. A scorer's part of
# the step graph is the same whichever decoder reads it, so the 42 products of the three would
# repeat these graphs, at seconds of export each.
COMBINATIONS = {
    "gru-luong-additive": dict(rnn_type="gru", decoder="luong", attention="additive"),
    "lstm-bahdanau-dot-sparsemax": dict(rnn_type="lstm", decoder="bahdanau", attention="dot",
                                        attention_options={"normalizer": "sparsemax"}),
    "gru-luong_no_feed-multihead_scaled_dot": dict(
        rnn_type="gru", decoder="luong", input_feeding=False, attention="multihead",
        attention_options={"heads": 2, "scorer": {
            "_target_": "scaled_dot", "_partial_": True}}),
    "lstm-luong-general-2layers": dict(rnn_type="lstm", decoder="luong", attention="general",
                                       num_layers=2, encoder_layers=2),
    "gru-bahdanau-gaussian-unidirectional": dict(rnn_type="gru", decoder="bahdanau",
                                                 attention="gaussian", bidirectional=False,
                                                 attention_options={"kernel": "epanechnikov"}),
    # max_length 10: traced at 5 source positions and checked at 9 below it, searched at 12.
    "lstm-luong_no_feed-location": dict(rnn_type="lstm", decoder="luong", input_feeding=False,
                                        attention="location",
                                        attention_options={"max_length": 10}),
    # Its state is a key/value cache that grows by a position a step.
    "transformer": dict(builder=random_transformer_model),
}


def random_model(name: str, seed: int = 0) -> torch.nn.Module:
    """A random tiny model of the ``COMBINATIONS`` entry ``name``."""
    options_of_model = dict(COMBINATIONS[name])
    build = options_of_model.pop("builder", random_luong_model)
    return build(vocab=VOCAB, seed=seed, **options_of_model)


def export_random(tmp_path: Path, name: str = "gru-luong-additive", *, seed: int = 0,
                  **options) -> tuple[torch.nn.Module, Path]:
    """A random tiny model of the ``COMBINATIONS`` entry ``name`` and its exported folder."""
    model = random_model(name, seed)
    folder = tmp_path / f"{name}-{seed}-{options.get('quantize', 'none')}"
    export_model(model, copy_tokenizers(), {"model": {}}, folder, **options)
    return model, folder


@pytest.fixture(scope="session")
def exported_random(tmp_path_factory):
    """Returns export(name="gru-luong-additive", quantize="none") -> (model, folder): each
    export made once for all test workers (an export takes seconds; :func:`made_once`), to be
    read, not changed."""

    def export(name: str = "gru-luong-additive", quantize: str = "none"):
        folder = made_once(tmp_path_factory, f"exported_random/{name}-{quantize}",
                           lambda path: export_model(random_model(name), copy_tokenizers(),
                                                     {"model": {}}, path, quantize=quantize))
        return random_model(name), folder

    return export


def exported_model(folder: Path) -> OnnxModel:
    model, _ = model_from_payload(load_model_payload(folder), torch.device("cpu"))
    return model


@pytest.mark.parametrize("name", list(COMBINATIONS))
def test_exported_graphs_search_as_the_model(exported_random, name):
    model, folder = exported_random(name)
    exported = exported_model(folder)
    src, src_lengths = padded_random_sources(6, vocab=VOCAB, max_len=12, seed=5)
    for search, options in ((greedy_search, {}), (beam_search, {"beam_size": 4, "nbest": 2})):
        want = search(model, src, src_lengths, return_attention=True, **options, **SEARCH)
        got = search(exported, src, src_lengths, return_attention=True, **options, **SEARCH)
        assert_same_hypotheses(got, want, score_tolerance=1e-4)


def test_ensembles_with_exported_members_are_the_ensembles_of_the_models(exported_random):
    first, folder = exported_random()
    second = random_luong_model(vocab=VOCAB, seed=1,
                                **COMBINATIONS["lstm-bahdanau-dot-sparsemax"])
    src, src_lengths = padded_random_sources(5, vocab=VOCAB, max_len=8, seed=2)
    options = {"beam_size": 3, "nbest": 2, "return_attention": True, **SEARCH}
    # Two exported members, through the Translator as the tools load them.
    translator = load_translator([folder, folder], device="cpu")
    assert isinstance(translator.model, Ensemble)
    want = beam_search(Ensemble([first, first]).eval(), src, src_lengths, **options)
    assert_same_hypotheses(beam_search(translator.model, src, src_lengths, **options), want,
                           score_tolerance=1e-4)
    # An exported member beside a PyTorch one.
    want = beam_search(Ensemble([first, second]).eval(), src, src_lengths, **options)
    mixed = Ensemble([exported_model(folder), second]).eval()
    assert_same_hypotheses(beam_search(mixed, src, src_lengths, **options), want,
                           score_tolerance=1e-4)


def test_int8_export_quantizes_the_products_and_stays_close(exported_random):
    _, fp32_folder = exported_random()
    _, int8_folder = exported_random(quantize="int8")
    manifest = json.loads((int8_folder / MANIFEST_NAME).read_text())
    assert manifest["export"]["quantize"] == "int8"
    ops = {node.op_type for node in onnx.load(str(int8_folder / "decoder_step.onnx")).graph.node}
    assert "DynamicQuantizeMatMul" in ops or "MatMulInteger" in ops, ops
    assert "GRU" not in ops  # the decoder's GRU step is products, quantized too
    src, src_lengths = padded_random_sources(4, vocab=VOCAB, max_len=7, seed=3)
    fp32, int8 = exported_model(fp32_folder), exported_model(int8_folder)
    with torch.no_grad():
        encoded = [m.encode(src, src_lengths) for m in (fp32, int8)]
        prev = torch.full((4,), 1)  # BOS
        logits = [m.decode_step(prev, m.init_state(e), e)[0]
                  for m, e in zip((fp32, int8), encoded, strict=True)]
    difference = (logits[0] - logits[1]).abs().max() / logits[0].abs().max()
    assert 0 < difference < 0.1  # quantized, and still the same model
    # The Translator takes quantize=int8 for it, and refuses it for anything else in one line;
    # without the option it still reports what runs.
    assert load_translator(int8_folder, quantize="int8", device="cpu").quantize == "int8"
    assert load_translator(int8_folder, device="cpu").quantize == "int8"
    for other in (fp32_folder,):
        with pytest.raises(ValueError, match="seq2seq-export .* quantize=int8"):
            load_translator(other, quantize="int8", device="cpu")


def test_exported_folder_refuses_other_precisions_devices_and_shortlists(exported_random):
    _, folder = exported_random()
    with pytest.raises(ValueError, match="precision=fp32"):
        load_translator(folder, precision="bf16", device="cpu")
    with pytest.raises(ValueError, match="device=cpu"):
        model_from_payload(load_model_payload(folder), torch.device("meta"))
    assert load_translator(folder, precision="auto", device="cpu").precision == "fp32"
    # device=auto (the tools' default) is the CPU for an exported model, even beside a GPU.
    translator = load_translator(folder, device="auto")
    assert translator.device.type == "cpu"
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    assert translator.parameter_count == manifest["parameters"] > 1000
    # An input the graphs cannot take is one line (a DataError, which the tools print).
    with pytest.raises(DataError, match="could not decode a batch") as raised:
        exported_model(folder).encode(torch.tensor([[VOCAB + 50, 2]]), torch.tensor([2]))
    assert "\n" not in str(raised.value)


class CumulativeMaxScorer(Scorer):
    """A user's scorer with an operation ONNX has no translation for (a dot product of the
    keys with the query's first ``key_dim`` features)."""

    def __init__(self, *, query_dim: int, key_dim: int) -> None:
        super().__init__()
        self.key_dim = key_dim

    def score(self, query, keys):
        return torch.cummax(query[..., :self.key_dim] @ keys.transpose(1, 2), dim=-1).values


class SizeReadingScorer(Scorer):
    """A user's scorer whose Python code reads a size: traced, the graph fixes it."""

    def __init__(self, *, query_dim: int, key_dim: int) -> None:
        super().__init__()
        self.key_dim = key_dim

    def score(self, query, keys):
        return (query[..., :self.key_dim] @ keys.transpose(1, 2)) / int(keys.size(1))


@pytest.mark.parametrize(("scorer", "message"), [
    (CumulativeMaxScorer,
     "cannot export the decoder step: the operation aten.cummax has no ONNX translation"),
    (SizeReadingScorer, "(do not run|differ from the model)"),
])
def test_a_scorer_that_does_not_export_is_named_in_one_line(tmp_path, scorer, message):
    # A unidirectional encoder (keys of 8 features): an RNN's export takes seconds a direction.
    model = random_luong_model(vocab=VOCAB, attention="general", bidirectional=False)
    model.decoder.attention.scorer = scorer(query_dim=16, key_dim=8)
    with pytest.raises(ExportError, match=message) as raised:
        export_model(model, copy_tokenizers(), {}, tmp_path / "out")
    assert "\n" not in str(raised.value)
    assert list(tmp_path.iterdir()) == []  # nothing half-written, beside the output either
    if scorer is CumulativeMaxScorer:
        return
    # A failed export leaves nothing behind that changes the next one in the process.
    good, folder = export_random(tmp_path, "gru-bahdanau-gaussian-unidirectional")
    src, src_lengths = padded_random_sources(3, vocab=VOCAB, max_len=12, seed=4)
    want = greedy_search(good, src, src_lengths, **SEARCH)
    assert_same_hypotheses(greedy_search(exported_model(folder), src, src_lengths, **SEARCH), want,
                           score_tolerance=1e-4)


def test_existing_output_needs_overwrite_and_quantize_is_checked_first(tmp_path):
    model = random_luong_model(vocab=VOCAB)
    (tmp_path / "out").mkdir()
    with pytest.raises(ExportError, match="overwrite=true"):
        export_model(model, copy_tokenizers(), {}, tmp_path / "out")
    with pytest.raises(ExportError, match="quantize must be one of none, int8"):
        export_model(model, copy_tokenizers(), {}, tmp_path / "new", quantize="int4")
    # overwrite=true replaces an earlier export only, never another folder.
    (tmp_path / "out" / "best.pt").write_bytes(b"a checkpoint")
    with pytest.raises(ExportError, match="replaces only an earlier export"):
        export_model(model, copy_tokenizers(), {}, tmp_path / "out", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (tmp_path / "out" / "best.pt").read_bytes() == b"a checkpoint"


@pytest.mark.parametrize(("options", "message"), [
    ({"format": "tflite"}, "format must be one of onnx, ctranslate2, argos, web, huggingface, "
                           "got 'tflite'"),
    ({"format": "huggingface", "quantize": "int8"}, "format=huggingface takes no option quantize: "
     "it writes float32 weights; for int8, export with format=ctranslate2 or format=onnx"),
    ({"format": "ctranslate2", "opset": 17}, "format=ctranslate2 takes no option opset"),
    ({"source": "x"}, "format=onnx takes no option source"),
    ({"quantize": "int4"}, "quantize must be one of none, int8, got 'int4'"),
])
def test_export_checkpoint_refuses_options_before_reading_the_checkpoint(tmp_path, options,
                                                                        message):
    """The checkpoint named does not exist: each refusal comes before it is read."""
    with pytest.raises(ExportError, match=f"^{re.escape(message)}$"):
        export_checkpoint(tmp_path / "missing.pt", tmp_path / "out", **options)
    assert list(tmp_path.iterdir()) == []


# -- the command-line tools and the server on an exported folder --------------------------------
def test_export_py_writes_the_folder_and_translate_py_reads_it(trained_checkpoint,
                                                               exported_copy_model, tmp_path,
                                                               run_python):
    log = (exported_copy_model.parent / "export.log").read_text()
    assert log.startswith("exporting ") and "wrote " in log and "MB" in log
    assert sorted(p.name for p in exported_copy_model.iterdir()) == [
        "decoder_step.onnx", "encoder.onnx", MANIFEST_NAME, "source.model"]
    translated = run_python([ROOT / "translate.py", f"checkpoint={exported_copy_model}",
                             "beam_size=3", "nbest=2", "device=cpu"],
                            input="".join(f"{line}\n" for line in LINES), cwd=tmp_path, env=ENV,
                            timeout=120)
    assert translated.returncode == 0, translated.stderr
    expected = api_lines(trained_checkpoint, LINES, nbest=2, beam_size=3, device="cpu")
    assert translated.stdout.splitlines() == expected


@pytest.mark.parametrize(("arguments", "message"), [
    (["output=out"], "error: no checkpoint given: add checkpoint=PATH"),
    (["checkpoint=missing.pt", "output=out"], "error: checkpoint not found: missing.pt"),
    (["checkpoint=missing.pt", "output=out", "quantize=int4"],
     "error: quantize must be one of none, int8, got 'int4'"),
    (["checkpoint=missing.pt", "output=out", "opset=high"], "error: opset: expected an integer"),
    # An option of another format than the chosen one: refused, not left unused.
    (["checkpoint=missing.pt", "output=out", "from_code=de"],
     "error: format=onnx takes no option from_code"),
    (["checkpoint=missing.pt", "output=out", "format=ctranslate2", "opset=17"],
     "error: format=ctranslate2 takes no option opset"),
])
def test_export_py_refuses_bad_options_in_one_line(tmp_path, run_python, arguments, message):
    result = run_python([ROOT / "export.py", *arguments], cwd=tmp_path, env=ENV, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [message] or \
        result.stderr.strip().splitlines()[-1].startswith(message), result.stderr
    assert not (tmp_path / "out").exists()


def test_evaluate_py_scores_the_folder_as_the_checkpoint(trained_checkpoint, exported_copy_model,
                                                         tmp_path, run_python):
    scores = {}
    for name, path in (("checkpoint", trained_checkpoint), ("exported", exported_copy_model)):
        result = run_python([ROOT / "evaluate.py", f"checkpoint={path}", "beam_size=3",
                             "device=cpu", f"output_dir={tmp_path / name}"],
                            cwd=trained_checkpoint.parents[1], env=ENV, timeout=120)
        assert result.returncode == 0, result.stderr
        (summary,) = (tmp_path / name).glob("*.json")
        scores[name] = json.loads(summary.read_text())
    assert scores["exported"]["bleu"] == scores["checkpoint"]["bleu"]
    hypotheses = {name: Path(s["hypotheses"]).read_text() for name, s in scores.items()}
    assert hypotheses["exported"] == hypotheses["checkpoint"]


@pytest.mark.parametrize("damage", ["format_version", "manifest_entry", "truncated_graph",
                                    "missing_graph"])
def test_damaged_folder_gives_one_line_error(exported_copy_model, tmp_path, run_python, damage):
    folder = tmp_path / "damaged"
    shutil.copytree(exported_copy_model, folder)
    if damage == "format_version":
        manifest = json.loads((folder / MANIFEST_NAME).read_text())
        manifest["format_version"] = 99
        (folder / MANIFEST_NAME).write_text(json.dumps(manifest))
        expected = "format version 99; this seq2seq reads version 1"
    elif damage == "manifest_entry":
        manifest = json.loads((folder / MANIFEST_NAME).read_text())
        del manifest["graphs"]
        (folder / MANIFEST_NAME).write_text(json.dumps(manifest))
        expected = "is damaged: it lacks 'graphs'"
    elif damage == "truncated_graph":
        graph = folder / ENCODER_FILE
        graph.write_bytes(graph.read_bytes()[: graph.stat().st_size // 2])
        expected = f"cannot load .*{ENCODER_FILE}"
    else:
        (folder / ENCODER_FILE).unlink()
        expected = f"lacks its file {ENCODER_FILE}"
    with pytest.raises(CheckpointError, match=expected):
        load_translator(folder, device="cpu")
    result = run_python([ROOT / "translate.py", f"checkpoint={folder}", "text=red cat",
                         "device=cpu"], cwd=tmp_path, env=ENV, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "Traceback" not in result.stderr


def test_server_answers_from_the_folder_as_from_the_checkpoint(trained_checkpoint,
                                                               exported_copy_model):
    from fastapi.testclient import TestClient

    from seq2seq.serving.app import create_app
    from seq2seq.serving.models import load_model

    bodies = {}
    for name, path in (("checkpoint", trained_checkpoint), ("exported", exported_copy_model)):
        served = load_model(path, device="cpu", options=DecodeOptions(beam_size=3))
        assert served.scorer == "AdditiveScorer" and served.parameters > 1000
        with TestClient(create_app({"copy": served})) as client:
            response = client.post("/v1/translate",
                                   json={"text": LINES, "nbest": 2, "attention": True})
            assert response.status_code == 200, response.text
            bodies[name] = response.json()
    for got, want in zip(bodies["exported"]["translations"], bodies["checkpoint"]["translations"],
                         strict=True):
        assert [h["text"] for h in got["hypotheses"]] == [h["text"] for h in want["hypotheses"]]
        for a, b in zip(got["hypotheses"], want["hypotheses"], strict=True):
            assert a["score"] == pytest.approx(b["score"], abs=1e-4)
            if b.get("attention") is not None:
                torch.testing.assert_close(torch.tensor(a["attention"]),
                                           torch.tensor(b["attention"]), atol=1e-5, rtol=1e-4)


def test_manifest_names_what_a_service_needs(exported_copy_model):
    manifest = json.loads((exported_copy_model / MANIFEST_NAME).read_text())
    assert manifest["format"] == "seq2seq-onnx" and manifest["format_version"] == 1
    assert manifest["vocabulary"]["source_size"] == VOCAB
    # The special ids docs/export.md states; an unpruned target's logits are its own ids.
    assert {key: manifest["vocabulary"][key] for key in ("pad_id", "unk_id", "bos_id",
                                                          "eos_id")} == \
        {"pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3}
    assert manifest["vocabulary"]["target_ids"] == list(range(VOCAB))
    assert manifest["graphs"]["state"] == ["hidden"]
    assert manifest["export"]["quantize"] == "none" and manifest["export"]["opset"] >= 17
    assert manifest["config"]["model"]["attention"]["_target_"] == "additive"


def test_both_formats_write_the_common_manifest_entries_alike(exported_random, tmp_path):
    """One Transformer in both formats: the entries every manifest has
    (seq2seq.export.manifest) are equal; only the format's name and its own entries differ."""
    pytest.importorskip("ctranslate2")
    from seq2seq.export.ctranslate2_export import convert_model

    model, folder = exported_random("transformer")
    onnx_manifest = json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8"))
    ct2_manifest = convert_model(model, copy_tokenizers(), {"model": {}}, tmp_path / "ct2")
    assert json.loads((tmp_path / "ct2" / MANIFEST_NAME).read_text(encoding="utf-8")) == \
        ct2_manifest
    assert (onnx_manifest["format"], ct2_manifest["format"]) == ("seq2seq-onnx",
                                                                 "seq2seq-ctranslate2")
    for key in ("format_version", "package_version", "config", "parameters", "trainer_state",
                "vocabulary", "tokenizers"):
        assert onnx_manifest[key] == ct2_manifest[key], key
    for key in ("quantize", "source", "torch_version"):
        assert onnx_manifest["export"][key] == ct2_manifest["export"][key], key
    assert "graphs" in onnx_manifest and "graphs" not in ct2_manifest


# -- a service that is not this package: docs/export.md's example client ------------------------
CLIENT = ROOT / "docs" / "examples" / "onnx_client.py"
# The copy vocabulary's pieces kept as targets (the special ids are always kept): a logits
# column then differs from the sentencepiece id of its piece, as in a pruned joint model.
PRUNED_TARGET = range(5, VOCAB, 2)
CLIENT_LINES = ["red cat", "", "one two big house", "blue bird sun moon", "small tree green dog",
                "fish car two", "big big big house tree"]


def pruned_target_tokenizers():
    from seq2seq.data.tokenizer import SubsetTokenizer, Tokenizers

    shared = copy_tokenizers().src
    return Tokenizers(src=shared, tgt=SubsetTokenizer(base=shared, kept_ids=PRUNED_TARGET),
                      joint=True)


def pruned_gru_model() -> torch.nn.Module:
    """A random GRU with additive attention over the pruned target, whose greedy outputs on
    ``CLIENT_LINES`` mix EOS at the first step, short outputs and outputs cut at the limit."""
    from omegaconf import OmegaConf

    from seq2seq.models.build import build_model

    torch.manual_seed(0)
    model = build_model(OmegaConf.create(copy_model_config()), src_vocab_size=VOCAB,
                        tgt_vocab_size=pruned_target_tokenizers().tgt.vocab_size).eval()
    with torch.no_grad():
        model.generator.weight.mul_(3.0)
    return model


@pytest.fixture(scope="session")
def exported_pruned_gru(tmp_path_factory) -> Path:
    """The export of :func:`pruned_gru_model`, made once for all test workers; not to be
    changed."""
    return made_once(tmp_path_factory, "exported_random/pruned-gru",
                     lambda path: export_model(pruned_gru_model(), pruned_target_tokenizers(),
                                               {"model": {}}, path))


def test_docs_show_the_example_client_file():
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "export.md").read_text(),
                        flags=re.DOTALL)
    shown = [block for block in blocks if "onnxruntime.InferenceSession" in block]
    assert shown == [CLIENT.read_text()]


@pytest.mark.parametrize("family", ["gru-pruned-target", "transformer"])
def test_example_client_translates_as_translate_py(family, exported_random, exported_pruned_gru,
                                                   tmp_path, run_python):
    folder = exported_pruned_gru if family == "gru-pruned-target" else exported_random(family)[1]
    text = "".join(f"{line}\n" for line in CLIENT_LINES)
    want = run_python([ROOT / "translate.py", f"checkpoint={folder}", "beam_size=1",
                       "device=cpu"], input=text, cwd=tmp_path, env=ENV, timeout=120)
    assert want.returncode == 0, want.stderr
    # A fresh interpreter in which torch and this package cannot be imported; ONNX Runtime at
    # its default log level, which prints its warnings (a size a graph states wrongly, say).
    for module in ("torch", "seq2seq"):
        (tmp_path / f"{module}.py").write_text(f"raise ImportError('the client needs no {module}')")
    got = subprocess.run([sys.executable, str(CLIENT), str(folder)], input=text, cwd=tmp_path,
                         env={**ENV, "PYTHONPATH": str(tmp_path)}, capture_output=True,
                         text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert got.stderr == ""
    assert got.stdout.splitlines() == want.stdout.splitlines()
    assert len({line for line in got.stdout.splitlines() if line}) >= 2  # not all alike


def test_pruned_target_manifest_maps_logits_to_the_pieces(exported_pruned_gru, tmp_path):
    manifest = json.loads((exported_pruned_gru / MANIFEST_NAME).read_text())
    kept = [0, 1, 2, 3, *PRUNED_TARGET]
    assert manifest["vocabulary"]["target_ids"] == kept
    assert manifest["vocabulary"]["target_size"] == len(kept)
    # Our tools translate the pieces of the kept ids (not the logits' own indices)...
    translator = load_translator(exported_pruned_gru, device="cpu")
    greedy = DecodeOptions(beam_size=1)
    translations = [n_best[0] for n_best in translator.translate(CLIENT_LINES, greedy)]
    tokens = [token for translation in translations
              for token in translator.tokenizers.tgt.encode([translation.text])[0]]
    assert tokens and all(token < len(kept) for token in tokens)
    # ... and so they do with a folder exported before the manifest gave target_ids.
    old = tmp_path / "old"
    shutil.copytree(exported_pruned_gru, old)
    del manifest["vocabulary"]["target_ids"]
    (old / MANIFEST_NAME).write_text(json.dumps(manifest))
    old_translator = load_translator(old, device="cpu")
    assert [n_best[0].text for n_best in old_translator.translate(CLIENT_LINES, greedy)] == \
        [translation.text for translation in translations]


def _declared(value) -> list[int | str]:
    return [dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim]


@pytest.mark.parametrize(("name", "quantize"), [*((name, "none") for name in COMBINATIONS),
                                                ("gru-luong-additive", "int8")])
def test_graphs_declare_every_open_axis(exported_random, capfd, name, quantize):
    _, folder = exported_random(name, quantize)
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 2  # warnings
    graphs = {}
    for graph in ("encoder", "decoder_step"):
        path = str(folder / manifest["graphs"][graph])
        declared = onnx.load(path).graph
        graphs[graph] = (onnxruntime.InferenceSession(path, options,
                                                      providers=["CPUExecutionProvider"]),
                         {value.name: _declared(value)
                          for value in (*declared.input, *declared.output)})
    capfd.readouterr()
    # Batches unlike the traced one (3 sentences, 7 rows, 5 positions, 3 decoded), and a
    # sentence with its beams.
    for sentences, length, beams in ((2, 6, 3), (1, 8, 1), (4, 14, 2)):
        src, src_lengths = padded_random_sources(sentences, vocab=VOCAB, max_len=length,
                                                 seed=length)
        feeds = {"src": src.numpy(), "src_lengths": src_lengths.numpy()}
        for graph, steps in (("encoder", 1), ("decoder_step", 4)):
            session, declared = graphs[graph]
            names = [value.name for value in session.get_outputs()]
            sizes: dict[str, int] = {}  # one size for each name, in a run
            for step in range(steps):
                if graph == "decoder_step":
                    feeds["prev_tokens"] = np.full(sentences * beams, 2 + step, dtype=np.int64)
                outputs = dict(zip(names, session.run(None, feeds), strict=True))
                for value, array in (*feeds.items(), *outputs.items()):
                    assert len(declared[value]) == array.ndim, value
                    for axis, (dim, size) in enumerate(zip(declared[value], array.shape,
                                                           strict=True)):
                        if isinstance(dim, int):
                            assert dim == size, (graph, value, axis, dim, size)
                        else:
                            assert sizes.setdefault(f"{step}:{dim}", size) == size, (value, dim)
                if graph == "encoder":
                    feeds = {key: np.repeat(array, beams, axis=0)
                             for key, array in outputs.items()}
                else:
                    feeds.update((state, outputs[f"new_{state}"])
                                 for state in manifest["graphs"]["state"])
    assert capfd.readouterr().err == ""  # ONNX Runtime's warnings, e.g. a size stated wrongly


def test_an_exported_model_keeps_to_constraints_and_prefixes(trained_checkpoint,
                                                              exported_copy_model):
    """#55 through ONNX Runtime: every translation starts with its prefix and holds its phrases,
    as the checkpoint's own Translator writes them."""
    prefixes = ["green", "", "sun", "", "", "red"]
    constraints = [["moon"], [], ["fish", "small tree"], [], ["dog"], []]
    exported = load_translator(exported_copy_model, device="cpu")
    beam2 = DecodeOptions(beam_size=2)
    steered = exported.translate(LINES, beam2, prefixes=prefixes, constraints=constraints)
    for line, n_best, prefix, phrases in zip(LINES, steered, prefixes, constraints, strict=True):
        text = n_best[0].text
        assert not line and text == "" or text.startswith(prefix) and all(
            phrase in text for phrase in phrases)
    checkpoint = load_translator(trained_checkpoint, device="cpu")
    assert [n[0].text for n in steered] == [n[0].text for n in checkpoint.translate(
        LINES, beam2, prefixes=prefixes, constraints=constraints)]


def test_a_nan_in_an_exported_folder_s_scores_fails_its_check():
    """The folder's check against the model takes the largest difference over all pairs; a
    NaN anywhere (not only in the first pair) is the largest."""
    from seq2seq.export.folder import largest_log_prob_difference, model_log_probs

    model, tokenizers = random_transformer_model(vocab=39), copy_tokenizers()

    def score(sources, targets, *, nan_at=None):
        log_probs = model_log_probs(model, sources, targets)
        if nan_at is not None:
            log_probs[nan_at][0] = np.nan
        return log_probs

    assert largest_log_prob_difference(model, tokenizers, score, whose="ours",
                                       tolerance=1e-6) == 0.0
    with pytest.raises(ExportError, match=r"ours log-probabilities differ .* by nan"):
        largest_log_prob_difference(model, tokenizers, lambda s, t: score(s, t, nan_at=1),
                                    whose="ours", tolerance=1e-6)
