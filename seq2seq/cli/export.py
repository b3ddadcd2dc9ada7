"""``python export.py checkpoint=PATH output=DIR [overrides]`` / ``seq2seq-export``: export a
checkpoint as a folder that ONNX Runtime decodes (:mod:`seq2seq.export.onnx_export`), or a
Transformer as a CTranslate2 model (``format=ctranslate2``,
:mod:`seq2seq.export.ctranslate2_export`), with an Argos Translate package beside its files
(``format=argos``, :mod:`seq2seq.export.argos`), or as a Hugging Face ``transformers`` folder
(``format=huggingface``, :mod:`seq2seq.export.huggingface`).

    python export.py checkpoint=runs/x/checkpoints/best.pt output=exported/x
    python export.py checkpoint=runs/x/checkpoints/best.pt output=exported/x-int8 quantize=int8
    echo "Ein Hund läuft." | python translate.py checkpoint=exported/x-int8
    python export.py checkpoint=runs/t/checkpoints/best.pt output=exported/t-ct2 format=ctranslate2
    python export.py checkpoint=runs/t/checkpoints/best.pt output=exported/t-argos format=argos
    python export.py checkpoint=runs/t/checkpoints/best.pt output=exported/t-hf format=huggingface

Options are documented in ``seq2seq/configs/export.yaml``. Exits with status 1 and a one-line
``error: ...`` on a missing or unsafe checkpoint, a model part that cannot be exported (named),
an existing output folder without ``overwrite=true``, an invalid option (``quantize=int8`` with
``format=huggingface``, which writes float32 weights), or (``format=argos``) languages the
checkpoint does not name and the command does not give.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from seq2seq.cli.app import hydra_tool
from seq2seq.cli.common import fail
from seq2seq.config_types import ConfigError, check_value
from seq2seq.inference.export_format import QUANTIZE_MODES

log = logging.getLogger("seq2seq.export")
OPTION_TYPES = {"checkpoint": str, "output": str, "format": str, "quantize": str, "opset": int,
                "overwrite": bool, "from_code": str | None, "to_code": str | None,
                "from_name": str | None, "to_name": str | None,
                "package_version": str | int | float, "sbd_model": str | None}
# The packages each format needs (the export extra has them all).
FORMAT_PACKAGES = {"onnx": ("onnx", "onnxscript", "onnxruntime"), "ctranslate2": ("ctranslate2",),
                   "argos": ("ctranslate2",), "huggingface": ("transformers", "safetensors")}
# Each format's own options (besides overwrite), as its writer takes them.
FORMAT_OPTIONS = {"onnx": ("quantize", "opset"), "ctranslate2": ("quantize",),
                  "argos": ("quantize", "from_code", "to_code", "from_name", "to_name",
                            "package_version", "sbd_model"),
                  "huggingface": ()}
# The extra that brings each format's packages.
FORMAT_EXTRAS = {"onnx": "export", "ctranslate2": "export", "argos": "export",
                 "huggingface": "hf"}


def run(cfg: DictConfig) -> dict:
    """Export as configured; returns the manifest written."""
    for key in ("checkpoint", "output"):
        if OmegaConf.is_missing(cfg, key) or not cfg[key]:
            fail(f"no {key} given: add {key}={'PATH' if key == 'checkpoint' else 'DIR'}")
    for key, annotation in OPTION_TYPES.items():
        try:
            check_value(cfg[key], annotation, key)
        except ConfigError as error:
            fail(error)
    if cfg.format not in FORMAT_PACKAGES:
        fail(f"format must be one of {', '.join(FORMAT_PACKAGES)}, got {cfg.format!r}")
    if cfg.quantize not in QUANTIZE_MODES:
        fail(f"quantize must be one of {', '.join(QUANTIZE_MODES)}, got {cfg.quantize!r}")
    if cfg.format == "huggingface" and cfg.quantize != "none":
        fail("format=huggingface writes float32 weights (quantize=none); for int8, export "
             "with format=ctranslate2 or format=onnx")
    if not Path(cfg.checkpoint).is_file():
        fail(f"checkpoint not found: {cfg.checkpoint}")
    # torch loads from here on: a bad option or a mistyped path above is refused without it.
    import importlib.util

    from seq2seq.checkpoint import CheckpointError

    missing = [name for name in FORMAT_PACKAGES[cfg.format]
               if importlib.util.find_spec(name) is None]
    if missing:
        extra = FORMAT_EXTRAS[cfg.format]
        fail(f"format={cfg.format} needs the {extra} extra ({', '.join(missing)} missing): "
             f"pip install '.[{extra}]'")
    from seq2seq.export import export_checkpoint
    from seq2seq.export.folder import ExportError

    started = time.perf_counter()
    log.info("exporting %s to %s (format=%s, quantize=%s)", cfg.checkpoint, cfg.output,
             cfg.format, cfg.quantize)
    options = {key: cfg[key] for key in FORMAT_OPTIONS[cfg.format]}
    try:
        manifest = export_checkpoint(cfg.checkpoint, cfg.output, format=cfg.format,
                                     overwrite=cfg.overwrite, **options)
    except (CheckpointError, ExportError) as error:
        fail(error)
    except OSError as error:
        fail(f"cannot write {cfg.output}: {error.strerror or error}")
    if cfg.format == "argos":
        log.info("the Argos package: %s", Path(cfg.output, manifest["argos"]["package"]))
    size = sum(f.stat().st_size for f in Path(cfg.output).iterdir())
    if cfg.format == "huggingface":
        log.info("wrote %s (%.1f MB) in %.1fs; load it with transformers' "
                 "AutoModelForSeq2SeqLM.from_pretrained(%r) (docs/export.md#hugging-face)",
                 cfg.output, size / 1e6, time.perf_counter() - started, cfg.output)
    else:
        log.info("wrote %s (%.1f MB) in %.1fs; decode it with translate.py checkpoint=%s",
                 cfg.output, size / 1e6, time.perf_counter() - started, cfg.output)
    return manifest


# ``python export.py``: see the module docstring (``--help`` lists the options).
# package_version as written: Hydra would read 1.10 as the number 1.1.
main = hydra_tool(run, config_name="export", summary=__doc__.splitlines()[0],
                  literal_keys=("package_version",))


if __name__ == "__main__":
    main()
