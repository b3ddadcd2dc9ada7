"""Package a Transformer for Argos Translate and LibreTranslate (``seq2seq-export format=argos``).

An Argos package (``.argosmodel``) is a zip of one folder: ``metadata.json``, ``model/`` (the
CTranslate2 folder of :mod:`seq2seq.export.ctranslate2_export` as it is),
``sentencepiece.model`` (the source model, with which Argos encodes the source and decodes the
target pieces) and, optionally, ``minisbd/`` (a sentence splitter). The output folder is that
CTranslate2 folder, with the package beside its files. docs/export.md ("Argos Translate and
LibreTranslate") gives the layout, what is refused, and how the package is read back as Argos
reads it before it is published.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from seq2seq.checkpoint import LANGUAGE_NAMES, recorded_languages
from seq2seq.config_types import error_reason
from seq2seq.data.vocab import EOS_ID
from seq2seq.export.ctranslate2_export import write_model_folder
from seq2seq.export.folder import ExportError, check_export_options, staged_folder
from seq2seq.export.manifest import write_manifest

METADATA_NAME = "metadata.json"
# Argos never checks argos_version; its own example metadata gives "1.0" (argostranslate/package.py).
ARGOS_VERSION = "1.0"
# Argos's codes: ISO 639 in lower case, and its own "zt" and "pb" (LibreTranslate lowers the
# codes it is given and maps zh-Hans, zh-Hant and pt-BR to zh, zt and pb).
LANGUAGE_CODE = re.compile(r"[a-z]{2,3}")
PACKAGE_VERSION = re.compile(r"\d+(?:\.\d+)*")
# The first id after the special pieces (pad, unk, bos, eos), which CTranslate2 never returns
# as text (Argos replaces an <unk>).
FIRST_ORDINARY_ID = EOS_ID + 1


def package_metadata(config: dict[str, Any], *, from_code: str | None = None,
                     to_code: str | None = None, from_name: str | None = None,
                     to_name: str | None = None, package_version: str = "1.0") -> dict[str, Any]:
    """The package's ``metadata.json``: the languages given, or the ones the checkpoint's data
    config names (``data.src_lang``, ``data.tgt_lang``).

    Raises:
        ExportError: when a language is neither given nor named by the config, or a code or
            the version is malformed.
    """
    data = config.get("data") or {}
    codes = {}
    for option, given, key, named in zip(("from_code", "to_code"), (from_code, to_code),
                                         ("src_lang", "tgt_lang"), recorded_languages(config),
                                         strict=True):
        code = given or named
        if not code:
            raise ExportError(f"format=argos needs {option}=: the checkpoint's data config "
                              f"names no language ({key}: {data.get(key)})")
        if not LANGUAGE_CODE.fullmatch(str(code)):
            raise ExportError(f"{option} must be a language code as Argos writes it (de, en, "
                              f"zt: two or three lower-case letters), got {code!r}")
        codes[option] = str(code)
    if codes["from_code"] == codes["to_code"]:
        raise ExportError(f"from_code and to_code are both {codes['from_code']!r}")
    if not PACKAGE_VERSION.fullmatch(str(package_version)):
        raise ExportError(f"package_version must be numbers and dots such as 1.0, "
                          f"got {package_version!r}")
    return {"package_version": str(package_version), "argos_version": ARGOS_VERSION,
            "from_code": codes["from_code"], "to_code": codes["to_code"],
            "from_name": from_name or LANGUAGE_NAMES.get(codes["from_code"], codes["from_code"]),
            "to_name": to_name or LANGUAGE_NAMES.get(codes["to_code"], codes["to_code"]),
            "type": "translate"}


def package_name(metadata: dict[str, Any]) -> str:
    """The package's top folder (its folder once installed), as in Argos's index:
    ``translate-de_en-1_0``."""
    version = metadata["package_version"].replace(".", "_")
    return f"translate-{metadata['from_code']}_{metadata['to_code']}-{version}"


def check_sources_untagged(config: dict[str, Any]) -> None:
    """Refuse (ExportError) a model trained on tagged sources only: Argos puts no tag before a
    source."""
    corpora = (config.get("data") or {}).get("train")
    if isinstance(corpora, list) and corpora and all(c.get("tag") for c in corpora):
        raise ExportError("every training corpus has a tag, and Argos puts none before a "
                          "source: train with an untagged corpus to package the model")


def check_sbd_model(sbd_model: str | Path | None) -> None:
    """Refuse a sentence splitter that is not a MiniSBD ``.onnx`` file, before any work."""
    if sbd_model is not None and not (Path(sbd_model).is_file()
                                      and Path(sbd_model).suffix == ".onnx"):
        raise ExportError(f"sbd_model must be a MiniSBD .onnx file, got {sbd_model}")


def argos_text(source_model, pieces: list[str]) -> str:
    """Target pieces as Argos turns them into text: decoded with the source model, its space
    marks (left on pieces the model lacks) made spaces, and the leading space dropped. Argos
    also makes every "_" a space, which no check here can change (docs/export.md says so)."""
    text = source_model.decode_pieces(pieces).replace("\u2581", " ")
    return text[1:] if text.startswith(" ") else text


def write_package(folder: Path, path: Path, metadata: dict[str, Any], source_model: str,
                  sbd_model: str | Path | None) -> None:
    """Zip ``folder`` (a CTranslate2 folder written by :func:`write_model_folder`, its manifest
    included, and ``source_model`` its source sentencepiece file) as the Argos package
    ``path``."""
    top = package_name(metadata)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"{top}/{METADATA_NAME}", json.dumps(metadata, indent=1) + "\n")
        for file in sorted(folder.iterdir()):
            if file != path:
                archive.write(file, f"{top}/model/{file.name}")
        archive.write(folder / source_model, f"{top}/sentencepiece.model")
        if sbd_model is not None:
            archive.write(sbd_model, f"{top}/minisbd/{Path(sbd_model).name}")


def check_package(path: Path, tokenizers) -> None:
    """Read the package back as Argos reads it: one top folder, ``metadata.json``, the
    CTranslate2 model (extracted, loaded and run once, as Argos extracts a package it installs),
    the source model's pieces as the model's source vocabulary and every target piece decoded
    as our target model decodes it.

    Raises:
        ExportError: naming what Argos would read wrong, or what the package lacks.
    """
    try:
        with zipfile.ZipFile(path) as archive, tempfile.TemporaryDirectory() as extracted:
            _check_archive(archive, Path(extracted), tokenizers)
    except (zipfile.BadZipFile, json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ExportError(f"Argos cannot read the package: {error_reason(error)}") from None


def _member(archive: zipfile.ZipFile, name: str) -> bytes:
    """The bytes of the package's file ``name``; an ExportError naming it where it is absent."""
    if name not in archive.namelist():
        raise ExportError(f"the package lacks {name}")
    return archive.read(name)


def _check_archive(archive: zipfile.ZipFile, extracted: Path, tokenizers) -> None:
    """:func:`check_package` on the open ``archive``, its model extracted under ``extracted``."""
    import ctranslate2
    import sentencepiece

    names = [name for name in archive.namelist() if not name.endswith("/")]
    tops = {name.split("/", 1)[0] for name in names}
    if len(tops) != 1 or any("/" not in name for name in names):
        raise ExportError(f"the package holds {sorted(tops)}, not one top folder")
    top = tops.pop()
    metadata = json.loads(_member(archive, f"{top}/{METADATA_NAME}"))
    keys = ("package_version", "argos_version", "from_code", "to_code", "from_name",
            "to_name", "type")
    if not isinstance(metadata, dict) or not all(
            isinstance(metadata.get(key), str) for key in keys) or metadata["type"] != "translate":
        raise ExportError(f"the package's {METADATA_NAME} lacks one of {', '.join(keys)}")
    source_model = sentencepiece.SentencePieceProcessor(
        model_proto=_member(archive, f"{top}/sentencepiece.model"))
    archive.extractall(extracted, [name for name in names if name.startswith(f"{top}/model/")])
    model = extracted / top / "model"
    vocabularies = {}
    for side in ("source", "target"):
        own = model / f"{side}_vocabulary.json"
        file = own if own.is_file() else model / "shared_vocabulary.json"
        if not file.is_file():
            raise ExportError(f"the package's model/ lacks {own.name} and "
                              "shared_vocabulary.json")
        vocabularies[side] = json.loads(file.read_text(encoding="utf-8"))
    source_pieces = [source_model.id_to_piece(i) for i in range(source_model.get_piece_size())]
    if vocabularies["source"] != source_pieces:
        raise ExportError("the package's sentencepiece.model is not the model's source "
                          "vocabulary")
    for piece in vocabularies["target"][FIRST_ORDINARY_ID:]:
        if argos_text(source_model, [piece]) != tokenizers.tgt.decode_pieces([[piece]])[0]:
            raise ExportError(
                f"Argos would write the target piece {piece!r} as "
                f"{argos_text(source_model, [piece])!r}: it decodes target pieces with the "
                "source model, which lacks the target model's byte fallback")
    try:
        translator = ctranslate2.Translator(str(model), device="cpu", intra_threads=1)
        translator.translate_batch([source_pieces[FIRST_ORDINARY_ID:FIRST_ORDINARY_ID + 1]],
                                   max_decoding_length=2)
    except Exception as error:  # ctranslate2's own errors
        raise ExportError(f"CTranslate2 cannot load the package's model: "
                          f"{error_reason(error)}") from None


def package_model(model, tokenizers, config: dict[str, Any], output: str | Path, *,
                  from_code: str | None = None, to_code: str | None = None,
                  from_name: str | None = None, to_name: str | None = None,
                  package_version: str = "1.0", sbd_model: str | Path | None = None,
                  quantize: str = "none", overwrite: bool = False,
                  trainer_state: dict[str, Any] | None = None,
                  source: str | None = None) -> dict[str, Any]:
    """Write ``model`` (a Transformer, on the CPU) as the CTranslate2 folder ``output`` with
    the Argos package ``<package_name>.argosmodel`` in it; returns the folder's manifest, whose
    ``argos`` entry has the metadata and the package's file name. The languages (by default
    those the run config names) and ``package_version`` make :func:`package_metadata`;
    ``sbd_model`` is a MiniSBD ``.onnx`` file to ship (None: Argos fetches one); the other arguments
    are :func:`~seq2seq.export.ctranslate2_export.convert_model`'s.

    Raises:
        ExportError: when the model is not a Transformer, would not translate the same in
            Argos, or an option is invalid.
        OSError: when the folder cannot be written.
    """
    check_export_options(output, quantize=quantize, overwrite=overwrite)
    check_sbd_model(sbd_model)
    check_sources_untagged(config)
    metadata = package_metadata(config, from_code=from_code, to_code=to_code,
                                from_name=from_name, to_name=to_name,
                                package_version=package_version)
    started = time.perf_counter()
    with staged_folder(Path(output), overwrite=overwrite) as staging:
        manifest = write_model_folder(model.eval(), tokenizers, config, staging,
                                      quantize=quantize, trainer_state=trainer_state,
                                      source=source)
        package = staging / f"{package_name(metadata)}.argosmodel"
        manifest["argos"] = {**metadata, "package": package.name,
                             "sbd_model": None if sbd_model is None else Path(sbd_model).name}
        write_manifest(staging, manifest, started=started)
        write_package(staging, package, metadata, manifest["tokenizers"]["files"]["src"],
                      sbd_model)
        check_package(package, tokenizers)
    return manifest
