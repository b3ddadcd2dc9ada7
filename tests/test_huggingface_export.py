"""format=huggingface (seq2seq.export.huggingface): a Transformer as a transformers folder, read
by the real client.

Every comparison is between implementations on fixed random weights: the folder loaded by
``transformers`` in a fresh interpreter that imports no seq2seq module, against our greedy
search and translate.py on the checkpoint it was exported from. The three checkpoints cover
a tied and an untied output layer, a pruned and a whole target vocabulary, joint and separate
tokenizers, and one table for source, target and output (model.share_all_embeddings).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import (  # noqa: E402
    build_copy_checkpoint,
    copy_tokenizers,
    greedy_search,
    made_once,
    sentences,
    transformer_model_config,
    write_copy_corpus,
)

from seq2seq.checkpoint import (  # noqa: E402
    FORMAT_VERSION,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
    tokenizers_to_payload,
)
from seq2seq.data.tokenizer import SentencePieceTokenizer, SubsetTokenizer, Tokenizers  # noqa: E402
from seq2seq.data.vocab import EOS_ID, UNK_ID  # noqa: E402
from seq2seq.export import export_checkpoint, huggingface  # noqa: E402
from seq2seq.export.folder import ExportError  # noqa: E402
from seq2seq.models.build import build_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LINES = sentences(6, seed=11)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
# Loads each folder given with transformers alone and translates the JSON list of lines on
# stdin, each alone with translate.py's default length limit (floor(1.5 n + 10) pieces, n
# counting </s>). One interpreter for all the folders: importing transformers takes seconds.
CLIENT = """
import json, sys
import sentencepiece, torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

lines, outputs = json.load(sys.stdin), {}
for folder in sys.argv[1:]:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    ids, texts = [], []
    for line in lines:
        batch = tokenizer([line], return_tensors="pt")
        limit = int(1.5 * batch["input_ids"].shape[1] + 10)
        with torch.no_grad():
            output = model.generate(**batch, max_new_tokens=limit + 1)[0]
        ids.append(output.tolist())
        texts.append(tokenizer.decode(output, skip_special_tokens=True))
    outputs[folder] = {"ids": ids, "texts": texts}
imported = sorted(name for name in sys.modules if name.split(".")[0] == "seq2seq")
print(json.dumps({"folders": outputs, "seq2seq_modules": imported}))
"""


def separate_tokenizers() -> Tokenizers:
    """The copy corpus's source model, and a target model of another size over upper-cased
    sentences."""
    target = SentencePieceTokenizer.train([line.upper() for line in sentences(2000, seed=0)],
                                          model_type="bpe", vocab_size=45, seed=1,
                                          max_sentences=0)
    return Tokenizers(src=copy_tokenizers().src, tgt=target, joint=False)


def pruned_tokenizers() -> Tokenizers:
    """The copy corpus's joint model with a target side of 20 of its 39 pieces, out of order."""
    shared = copy_tokenizers().src
    return Tokenizers(src=shared, tgt=SubsetTokenizer(base=shared, kept_ids=range(38, 18, -1)),
                      joint=True)


VARIANTS = {  # name: (tokenizers, output layer: untied, tied or one table for all three)
    "joint-untied": (copy_tokenizers, "untied"),
    "pruned-tied": (pruned_tokenizers, "tied"),
    "separate-tied": (separate_tokenizers, "tied"),
    "shared-all": (copy_tokenizers, "shared"),
}


def write_checkpoint(directory: Path, name: str) -> Path:
    """A random tiny Transformer over the variant's tokenizers, saved as ``directory/name.pt``."""
    make_tokenizers, output = VARIANTS[name]
    tokenizers = make_tokenizers()
    torch.manual_seed(3)
    model_cfg = {**transformer_model_config(tie_embeddings=output == "tied"),
                 "share_all_embeddings": output == "shared"}
    model = build_model(model_cfg, src_vocab_size=tokenizers.src.vocab_size,
                        tgt_vocab_size=tokenizers.tgt.vocab_size).eval()
    with torch.no_grad():  # flatter outputs: many near-competitive continuations, and </s>
        model.generator.weight.mul_(3.0)  # less likely than the rest (shorter and longer ones)
        model.generator.weight[EOS_ID].mul_(0.3)
        model.generator.weight[UNK_ID].mul_(0.3)  # few <unk>: texts to compare
    directory.mkdir(parents=True, exist_ok=True)
    files = write_copy_corpus(directory)
    payload = {"format_version": FORMAT_VERSION, "model": model.state_dict(),
               "config": {"model": model_cfg,
                          "data": {"kind": "files", "src_lang": "de", "tgt_lang": "en", **files},
                          "tokenizer": {"model_type": "unigram", "joint": tokenizers.joint}},
               "tokenizers": tokenizers_to_payload(tokenizers)}
    path = directory / f"{name}.pt"
    save_checkpoint(payload, path)
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Per variant: its checkpoint and the folder exported from it (made once per session)."""
    def make(path: Path) -> None:
        for name in VARIANTS:
            checkpoint = write_checkpoint(path, name)
            export_checkpoint(checkpoint, path / f"{name}-hf", format="huggingface")

    folder = made_once(tmp_path_factory, "huggingface_exports", make)
    return {name: (folder / f"{name}.pt", folder / f"{name}-hf") for name in VARIANTS}


def run_client(folders: list[Path], lines: list[str]) -> dict:
    """CLIENT over ``folders`` in a fresh interpreter: {"folders": {folder: {"ids", "texts"}},
    "seq2seq_modules": the seq2seq modules it imported}."""
    result = subprocess.run([sys.executable, "-c", CLIENT, *map(str, folders)],
                            input=json.dumps(lines), capture_output=True, text=True, env=ENV,
                            timeout=180, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def transformers_outputs(exported, tmp_path_factory) -> dict:
    """CLIENT's output over every variant's folder, run once per session."""
    def make(path: Path) -> None:
        path.mkdir()
        output = run_client([folder for _, folder in exported.values()], LINES)
        (path / "outputs.json").write_text(json.dumps(output), encoding="utf-8")

    folder = made_once(tmp_path_factory, "huggingface_client", make)
    return json.loads((folder / "outputs.json").read_text(encoding="utf-8"))


def our_greedy_ids(checkpoint: Path, lines: list[str]) -> list[list[int]]:
    """Our greedy search's output ids, as the target model's ids (a pruned target's compact
    ids mapped back), each line alone with translate.py's default limit."""
    model, tokenizers, _ = model_from_checkpoint(load_checkpoint(checkpoint))
    to_target = torch.as_tensor(tokenizers.target_ids)
    outputs = []
    for ids in tokenizers.src.encode(lines):
        src = torch.tensor([[*ids, EOS_ID]])
        best = greedy_search(model, src, torch.tensor([src.size(1)]), max_len_a=1.5,
                             max_len_b=10.0)[0][0]
        outputs.append(to_target[best.tokens].tolist())
    return outputs


@pytest.mark.parametrize("name", list(VARIANTS))
def test_transformers_alone_translates_as_translate_py(exported, transformers_outputs, name,
                                                      tmp_path, run_python):
    checkpoint, folder = exported[name]
    assert transformers_outputs["seq2seq_modules"] == []
    got = transformers_outputs["folders"][str(folder)]
    want_ids = our_greedy_ids(checkpoint, LINES)
    assert len({len(ids) for ids in want_ids}) > 1  # outputs of several lengths
    # generate's output: the start id, the translation, then the </s> it made or was forced to.
    assert [ids[1:-1] for ids in got["ids"]] == want_ids
    assert all(ids[-1] == EOS_ID for ids in got["ids"])
    result = run_python([ROOT / "translate.py", f"checkpoint={checkpoint}", "beam_size=1"],
                        input="".join(f"{line}\n" for line in LINES), cwd=tmp_path, env=ENV,
                        timeout=120)
    assert result.returncode == 0, result.stderr
    # A generated <unk> is one of skip_special_tokens' (docs/export.md): compared without it.
    texts = [(ours, theirs) for ours, theirs, ids in
             zip(result.stdout.splitlines(), got["texts"], want_ids, strict=True)
             if UNK_ID not in ids]
    assert len(texts) >= 3 and all(ours == theirs for ours, theirs in texts)


def test_the_folder_holds_what_transformers_and_the_hub_read(exported):
    _, folder = exported["pruned-tied"]
    assert {"config.json", "generation_config.json", "model.safetensors", "source.spm",
            "target.spm", "vocab.json", "tokenizer_config.json", "README.md",
            "manifest.json"} == {path.name for path in folder.iterdir()}
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert (config["model_type"], config["vocab_size"], config["d_model"]) == ("pegasus", 39, 12)
    # A Pegasus as transformers computes it: its own position table, which the folder carries.
    from safetensors.torch import load_file
    from transformers.models.pegasus.modeling_pegasus import PegasusSinusoidalPositionalEmbedding

    stored = load_file(folder / "model.safetensors")["model.encoder.embed_positions.weight"]
    pegasus = PegasusSinusoidalPositionalEmbedding(config["max_position_embeddings"], 12)
    torch.testing.assert_close(stored, pegasus.create_weight(), atol=2e-5, rtol=0)
    generation = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    assert generation["suppress_tokens"] == [0, 2] and generation["num_beams"] == 1
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["format"] == "seq2seq-huggingface"
    assert manifest["export"]["largest_log_prob_difference"] < 1e-3
    card = (folder / "README.md").read_text(encoding="utf-8")
    header = card.split("---\n")[1]
    assert "library_name: transformers" in header and "language: [de, en]" in header
    _, separate = exported["separate-tied"]
    assert (separate / "target_vocab.json").is_file()
    assert json.loads((separate / "tokenizer_config.json").read_text())["separate_vocabs"]


def test_a_folder_that_would_translate_otherwise_is_refused(tmp_path, monkeypatch):
    """The gate: a conversion that lets the pieces outside a pruned output layer compete is
    caught by the folder's own translations or log-probabilities, and nothing is written."""
    checkpoint = write_checkpoint(tmp_path / "run", "pruned-tied")
    monkeypatch.setattr(huggingface, "NEVER", 0.0)
    with pytest.raises(ExportError, match=r"^transformers' (greedy translation of check "
                                          r"sentence \d differs from ours: \[|"
                                          r"log-probabilities differ from the model's by )"):
        export_checkpoint(checkpoint, tmp_path / "out", format="huggingface")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run"]


def test_export_py_writes_the_folder_or_refuses_in_one_line(exported, tmp_path, run_python):
    checkpoint, folder = exported["joint-untied"]
    rnn = build_copy_checkpoint(tmp_path / "rnn")

    def run(script: str, *args: str):
        return run_python([ROOT / script, *args], cwd=tmp_path, env=ENV, timeout=120)

    def refused(*args: str) -> str:
        result = run("export.py", *args, "format=huggingface")
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        return result.stderr.strip().splitlines()[-1]

    assert re.fullmatch(
        r"error: format=huggingface converts a Transformer \(model/encoder=transformer "
        r"model/decoder=transformer\), not a \w+ with a \w+: export it with format=onnx "
        r"\(ONNX Runtime\), which takes every model",
        refused(f"checkpoint={rnn}", f"output={tmp_path / 'rnn-hf'}"))
    assert refused(f"checkpoint={checkpoint}", f"output={tmp_path / 'int8'}",
                   "quantize=int8").startswith("error: format=huggingface takes no option "
                                               "quantize: it writes float32 weights")
    assert refused(f"checkpoint={checkpoint}", f"output={folder}").endswith(
        "already exists: give overwrite=true to replace it, or another output")
    assert not (tmp_path / "rnn-hf").exists() and not (tmp_path / "int8").exists()

    written = run("export.py", f"checkpoint={checkpoint}", f"output={tmp_path / 'hf'}",
                  "format=huggingface")
    assert written.returncode == 0, written.stderr
    assert "AutoModelForSeq2SeqLM.from_pretrained" in written.stderr
    assert (tmp_path / "hf" / "model.safetensors").read_bytes() == \
        (folder / "model.safetensors").read_bytes()
    translated = run("translate.py", f"checkpoint={tmp_path / 'hf'}", "text=red cat")
    assert translated.returncode == 1 and "Traceback" not in translated.stderr
    assert "is a Hugging Face transformers folder: load it with transformers" in \
        translated.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("name", ["joint-untied", "pruned-tied"])
def test_ctranslate2s_converter_reads_the_folder_as_our_own_ctranslate2_export(
        exported, name, tmp_path):
    """ct2-transformers-converter's Pegasus loader on the folder, against format=ctranslate2 on
    the checkpoint: the same greedy text and scores (it registers one vocabulary for both sides:
    joint tokenizers only)."""
    ctranslate2 = pytest.importorskip("ctranslate2")

    checkpoint, folder = exported[name]
    ctranslate2.converters.TransformersConverter(str(folder)).convert(str(tmp_path / "theirs"))
    export_checkpoint(checkpoint, tmp_path / "ours", format="ctranslate2")
    tokenizer = copy_tokenizers().src
    options = {"beam_size": 1, "max_decoding_length": 30, "min_decoding_length": 0,
               "suppress_sequences": [["<pad>"], ["<s>"]], "return_scores": True}
    texts, scores = {}, {}
    for side, eos in (("theirs", ["</s>"]), ("ours", [])):  # ours adds the </s> itself
        translator = ctranslate2.Translator(str(tmp_path / side), device="cpu", intra_threads=1)
        sources = [tokenizer.pieces(ids) + eos for ids in tokenizer.encode(LINES)]
        results = translator.translate_batch(sources, **options)
        texts[side] = [tokenizer.decode_pieces([result.hypotheses[0]])[0] for result in results]
        scores[side] = [result.scores[0] for result in results]
    assert texts["theirs"] == texts["ours"] and len(set(texts["ours"])) > 1
    assert scores["theirs"] == pytest.approx(scores["ours"], abs=1e-4)
