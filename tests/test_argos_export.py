"""format=argos (seq2seq.export.argos): an Argos Translate package of a Transformer, read and
run by the real client.

The package is installed with argos-translate-lt into a temporary packages folder, in a fresh
interpreter (Argos reads its settings and folders at import), and its translations are compared
with CTranslate2's on the same folder, called with the arguments Argos passes, and with
translate.py's. Only Argos's sentence splitter is stood in for: it returns the text as one
sentence, where the real one would download a MiniSBD model.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import sentencepiece
import torch

ctranslate2 = pytest.importorskip("ctranslate2")

from conftest import (  # noqa: E402
    copy_tokenizers,
    made_once,
    transformer_model_config,
    write_copy_transformer_checkpoint,
)

from seq2seq.data.tokenizer import SentencePieceTokenizer, Tokenizers  # noqa: E402
from seq2seq.data.vocab import BOS_PIECE, EOS_PIECE, PAD_PIECE, UNK_PIECE  # noqa: E402
from seq2seq.export import export_checkpoint  # noqa: E402
from seq2seq.export.argos import (  # noqa: E402
    check_package,
    check_sources_untagged,
    package_metadata,
    package_model,
)
from seq2seq.export.folder import ExportError  # noqa: E402
from seq2seq.models.build import build_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOP = "translate-de_en-1_0"
# Copy-corpus sentences whose greedy translations (below) end before translate.py's length limit,
# are not empty and hold no <unk>, so Argos (256 pieces at most, one at least, an <unk> replaced
# by a source piece) must give the same.
LINES = ["red cat", "one two big house", "blue bird sun", "moon", "fish car two",
         "green dog sun"]
# What argostranslate.translate.apply_packaged_translation passes to translate_batch
# (argos-translate-lt 1.12), with ARGOS_BEAM_SIZE's default of 4 and ARGOS_BATCH_SIZE's of 32.
ARGOS_ARGUMENTS = {"replace_unknowns": True, "max_batch_size": 32, "batch_type": "tokens",
                   "length_penalty": 0.2, "return_scores": True}
ARGOS_BEAM_SIZE = 4
# Installs the package and translates the JSON list of lines on stdin with
# argostranslate.translate.translate and with the translation's hypotheses(line, 3).
ARGOS_CLIENT = """
import json, sys
from argostranslate import package, sbd, translate

# The one stand-in: the text as one sentence (MiniSBD would load, or download, a model).
sbd.MiniSBDSentencizer.split_sentences = lambda self, text: [text]
package.install_from_path(sys.argv[1])
lines = json.load(sys.stdin)
translation = translate.get_translation_from_codes("de", "en")
print(json.dumps({
    "translate": [translate.translate(line, "de", "en") for line in lines],
    "hypotheses": [[[h.value, h.score] for h in translation.hypotheses(line, 3)]
                   for line in lines],
    "installed": [str(p.package_path) for p in package.get_installed_packages()],
}))
"""


@pytest.fixture(scope="session")
def packaged(tmp_path_factory) -> tuple[Path, Path]:
    """(checkpoint, its format=argos folder with a stand-in MiniSBD file packaged), made once
    for all test workers, to be read, not changed."""

    def make(folder: Path) -> None:
        folder.mkdir(parents=True)
        write_copy_transformer_checkpoint(folder)
        (folder / "de.onnx").write_bytes(b"never loaded: the tests split no sentences")
        export_checkpoint(folder / "transformer.pt", folder / "argos", format="argos",
                          from_code="de", to_code="en", sbd_model=folder / "de.onnx")

    folder = made_once(tmp_path_factory, "argos_package", make)
    return folder / "transformer.pt", folder / "argos"


def run_argos(package: Path, home: Path, lines: list[str], **settings: str) -> dict:
    """ARGOS_CLIENT in a fresh interpreter whose Argos folders (packages, data, cache, config)
    are all under ``home``; ``settings``: Argos's environment settings (ARGOS_BEAM_SIZE...)."""
    env = {**os.environ, "HOME": str(home), "XDG_DATA_HOME": str(home / "data"),
           "XDG_CONFIG_HOME": str(home / "config"), "XDG_CACHE_HOME": str(home / "cache"),
           "ARGOS_PACKAGES_DIR": str(home / "packages"), "ARGOS_INTRA_THREADS": "1",
           "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8", **settings}
    result = subprocess.run([sys.executable, "-c", ARGOS_CLIENT, str(package)],
                            input=json.dumps(lines), capture_output=True, text=True, env=env,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_the_package_holds_what_argos_reads(packaged):
    checkpoint, folder = packaged
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    package = folder / f"{TOP}.argosmodel"
    assert manifest["argos"]["package"] == package.name and manifest["argos"]["to_code"] == "en"
    with zipfile.ZipFile(package) as archive:
        names = sorted(archive.namelist())
        assert {name.split("/")[0] for name in names} == {TOP}
        metadata = json.loads(archive.read(f"{TOP}/metadata.json"))
        assert metadata == {"package_version": "1.0", "argos_version": "1.0",
                            "from_code": "de", "to_code": "en", "from_name": "German",
                            "to_name": "English", "type": "translate"}
        # model/ is the output folder as it is, the package aside.
        model_files = sorted(path.name for path in folder.iterdir() if path != package)
        assert [name for name in names if name.startswith(f"{TOP}/model/")] == \
            [f"{TOP}/model/{name}" for name in model_files]
        for name in model_files:
            assert archive.read(f"{TOP}/model/{name}") == (folder / name).read_bytes()
        assert archive.read(f"{TOP}/sentencepiece.model") == \
            (folder / manifest["tokenizers"]["files"]["src"]).read_bytes()
        assert archive.read(f"{TOP}/minisbd/de.onnx") == \
            (checkpoint.parent / "de.onnx").read_bytes()


def test_argos_translates_as_ctranslate2_with_its_own_arguments(packaged, tmp_path):
    """translate() and hypotheses() of the installed package: CTranslate2's translations and
    scores under Argos's beam (4), length penalty (0.2) and batching, decoded by our tokenizer."""
    pytest.importorskip("argostranslate")
    _, folder = packaged
    got = run_argos(folder / f"{TOP}.argosmodel", tmp_path, LINES)
    assert got["installed"] == [str(tmp_path / "packages" / TOP)]
    translator = ctranslate2.Translator(str(folder), device="cpu", intra_threads=1)
    # Argos encodes with the package's sentencepiece.model, as pieces.
    sources = sentencepiece.SentencePieceProcessor(
        model_file=str(folder / "source.model")).encode(LINES, out_type=str)
    target = copy_tokenizers().tgt
    for nbest, key in ((1, "translate"), (3, "hypotheses")):
        results = translator.translate_batch(sources, beam_size=max(nbest, ARGOS_BEAM_SIZE),
                                             num_hypotheses=nbest, **ARGOS_ARGUMENTS)
        texts = [target.decode_pieces(result.hypotheses) for result in results]
        if key == "translate":
            assert got[key] == [n_best[0] for n_best in texts]
            continue
        assert [[value for value, _ in n_best] for n_best in got[key]] == texts
        for n_best, result in zip(got[key], results, strict=True):
            assert [score for _, score in n_best] == pytest.approx(result.scores, abs=1e-5)


def test_greedy_argos_agrees_with_translate_py_on_the_same_folder(packaged, tmp_path,
                                                                   run_python):
    pytest.importorskip("argostranslate")
    _, folder = packaged
    result = run_python([ROOT / "translate.py", f"checkpoint={folder}", "beam_size=1"],
                        input="".join(f"{line}\n" for line in LINES), cwd=tmp_path,
                        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"},
                        timeout=120)
    assert result.returncode == 0, result.stderr
    want = result.stdout.splitlines()
    assert all(want) and len(want) == len(LINES) and "\u2047" not in "".join(want)
    got = run_argos(folder / f"{TOP}.argosmodel", tmp_path, LINES, ARGOS_BEAM_SIZE="1")
    assert got["translate"] == want


def rewritten(package: Path, path: Path, change) -> Path:
    """A copy of ``package`` at ``path`` whose entries are ``change(name, data)``'s (name and
    data; None drops the entry)."""
    with zipfile.ZipFile(package) as source, zipfile.ZipFile(path, "w") as copy:
        for name in source.namelist():
            changed = change(name, source.read(name))
            if changed is not None:
                copy.writestr(*changed)
    return path


@pytest.mark.parametrize(("change", "message"), [
    (lambda name, data: (name.removeprefix(f"{TOP}/"), data) if name.endswith("metadata.json")
     else (name, data), r"^the package holds \['metadata.json', 'translate-de_en-1_0'\], not one "
                        r"top folder$"),
    (lambda name, data: (name, data.replace(b'"type": "translate"', b'"type": "sbd"')),
     r"^the package's metadata.json lacks one of package_version, .*, type$"),
    (lambda name, data: (name, separate_tokenizers(byte_fallback=False).src.to_bytes())
     if name.endswith("sentencepiece.model") else (name, data),
     r"^the package's sentencepiece.model is not the model's source vocabulary$"),
    (lambda name, data: None if name.endswith("model.bin") else (name, data),
     r"^CTranslate2 cannot load the package's model: "),
    (lambda name, data: None if name.endswith("metadata.json") else (name, data),
     r"^the package lacks translate-de_en-1_0/metadata.json$"),
    (lambda name, data: (name, b"{not json") if name.endswith("metadata.json") else (name, data),
     r"^Argos cannot read the package: Expecting property name"),
    (lambda name, data: None if name.endswith("sentencepiece.model") else (name, data),
     r"^the package lacks translate-de_en-1_0/sentencepiece.model$"),
    (lambda name, data: None if name.endswith("_vocabulary.json") else (name, data),
     r"^the package's model/ lacks source_vocabulary.json and shared_vocabulary.json$"),
], ids=["two-top-entries", "not-a-translation", "another-source-model", "no-model-bin",
        "no-metadata", "metadata-not-json", "no-sentencepiece-model", "no-vocabulary"])
def test_a_package_argos_would_read_wrong_is_refused(packaged, tmp_path, change, message):
    """check_package, which runs before a package is published, on damaged copies."""
    _, folder = packaged
    package = rewritten(folder / f"{TOP}.argosmodel", tmp_path / "damaged.argosmodel", change)
    with pytest.raises(ExportError, match=message):
        check_package(package, copy_tokenizers())


def test_the_languages_come_from_the_data_config_or_the_options():
    multi30k = {"data": {"kind": "multi30k", "src_lang": "de", "tgt_lang": "en"}}
    metadata = package_metadata(multi30k)
    assert (metadata["from_code"], metadata["to_name"]) == ("de", "English")
    metadata = package_metadata(multi30k, to_code="fr", to_name="Français",
                                package_version="2.10")
    assert (metadata["to_code"], metadata["to_name"], metadata["package_version"]) == \
        ("fr", "Français", "2.10")
    files = {"data": {"kind": "files", "src_lang": "src", "tgt_lang": "tgt"}}
    assert package_metadata(files, from_code="sv", to_code="zt")["to_name"] == "zt"
    with pytest.raises(ExportError, match=r"^format=argos needs from_code=: the checkpoint's "
                                          r"data config names no language \(src_lang: src\)$"):
        package_metadata(files, to_code="en")
    for options, message in (({"from_code": "zh-Hans"}, "from_code must be a language code"),
                             ({"to_code": "de"}, "from_code and to_code are both 'de'"),
                             ({"package_version": "v1"}, "package_version must be numbers")):
        with pytest.raises(ExportError, match=message):
            package_metadata(multi30k, **options)


def test_a_model_trained_on_tagged_sources_only_is_refused():
    corpora = [{"src": "a.de", "tgt": "a.en", "tag": "<a>"},
               {"src": "bt.de", "tgt": "bt.en", "tag": "<bt>"}]
    with pytest.raises(ExportError, match="every training corpus has a tag"):
        check_sources_untagged({"data": {"kind": "corpora", "train": corpora}})
    corpora[0]["tag"] = None  # an untagged corpus: Argos's untagged sources were seen
    check_sources_untagged({"data": {"kind": "corpora", "train": corpora}})


def separate_tokenizers(*, byte_fallback: bool) -> Tokenizers:
    """A source model and a target model of their own, the target's with or without byte
    fallback (sentencepiece's own trainer: ours does not offer it)."""
    import sentencepiece as spm

    def train(lines: list[str], **options) -> SentencePieceTokenizer:
        writer = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_writer=writer, model_type="bpe",
            hard_vocab_limit=False, pad_id=0, unk_id=1, bos_id=2, eos_id=3,
            pad_piece=PAD_PIECE, unk_piece=UNK_PIECE, bos_piece=BOS_PIECE,
            eos_piece=EOS_PIECE, minloglevel=2, **options)
        return SentencePieceTokenizer(model_proto=writer.getvalue())

    source = train(["ein roter hund läuft", "zwei katzen im garten"] * 20, vocab_size=40)
    target = train(["a red dog runs", "two cats in the garden"] * 20,
                   vocab_size=300 if byte_fallback else 40, byte_fallback=byte_fallback)
    return Tokenizers(src=source, tgt=target, joint=False)


@pytest.mark.parametrize("byte_fallback", [False, True], ids=["plain", "byte-fallback"])
def test_a_separate_target_model_round_trips_unless_argos_would_misspell_it(tmp_path,
                                                                           byte_fallback):
    """Argos decodes target pieces with the source model: pieces it lacks are written as they
    are (right), byte pieces as "<0x..>" (refused, nothing written)."""
    tokenizers = separate_tokenizers(byte_fallback=byte_fallback)
    torch.manual_seed(0)
    model_config = transformer_model_config(tie_embeddings=False)
    model = build_model(model_config, src_vocab_size=tokenizers.src.vocab_size,
                        tgt_vocab_size=tokenizers.tgt.vocab_size)
    config = {"model": model_config, "data": {"kind": "files", "src_lang": "de",
                                              "tgt_lang": "en"}}
    output = tmp_path / "argos"
    write = lambda: package_model(model, tokenizers, config, output, quantize="int8")  # noqa: E731
    if not byte_fallback:
        assert write()["argos"]["package"] == f"{TOP}.argosmodel"
        assert (output / f"{TOP}.argosmodel").is_file()
        return
    with pytest.raises(ExportError, match=r"^Argos would write the target piece '<0x00>' as "
                                          r"'<0x00>': it decodes target pieces with the source "
                                          r"model, which lacks the target model's byte fallback$"):
        write()
    assert list(tmp_path.iterdir()) == []


def test_export_py_writes_the_package_or_names_the_missing_language(packaged, tmp_path,
                                                                     run_python):
    checkpoint, _ = packaged
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
    refused = run_python([ROOT / "export.py", f"checkpoint={checkpoint}",
                          f"output={tmp_path / 'out'}", "format=argos", "to_code=en"],
                         cwd=tmp_path, env=env, timeout=120)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        "error: format=argos needs from_code=: the checkpoint's data config names no language "
        "(src_lang: src)")
    assert not (tmp_path / "out").exists()
    result = run_python([ROOT / "export.py", f"checkpoint={checkpoint}",
                         f"output={tmp_path / 'out'}", "format=argos", "from_code=de",
                         "to_code=en", "from_name=Deutsch", "package_version=2.10"],
                        cwd=tmp_path, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    # As written: not the number 2.1 Hydra would read.
    with zipfile.ZipFile(tmp_path / "out" / "translate-de_en-2_10.argosmodel") as archive:
        metadata = json.loads(archive.read("translate-de_en-2_10/metadata.json"))
        assert not [name for name in archive.namelist() if "/minisbd/" in name]
    assert (metadata["from_name"], metadata["package_version"]) == ("Deutsch", "2.10")
