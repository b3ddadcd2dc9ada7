"""``python export.py checkpoint=PATH output=DIR [overrides]`` / ``seq2seq-export``: export a
checkpoint as a folder that ONNX Runtime decodes, or, with ``format=``, as a CTranslate2 model,
an Argos Translate package, a Hugging Face ``transformers`` folder or a web page
(:data:`seq2seq.export.FORMATS`). The formats, with examples: docs/export.md; the options:
``seq2seq/configs/export.yaml``.

Exits with status 1 and a one-line ``error: ...`` on a missing or unsafe checkpoint, a model part
that cannot be exported (named), an existing output folder without ``overwrite=true``, an
invalid option (``quantize=int8`` with ``format=huggingface``, which writes float32 weights), or
(``format=argos``) languages the checkpoint does not name and the command does not give.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from seq2seq import CONFIG_DIR
from seq2seq.cli.app import hydra_tool
from seq2seq.cli.common import check_types, fail
from seq2seq.export import FORMATS, ExportError, export_checkpoint, export_format
from seq2seq.inference.export_format import check_quantize_mode

log = logging.getLogger("seq2seq.export")
OPTION_TYPES = {"checkpoint": str, "output": str, "format": str, "quantize": str, "opset": int,
                "overwrite": bool, "from_code": str | None, "to_code": str | None,
                "from_name": str | None, "to_name": str | None,
                "package_version": str | int | float, "sbd_model": str | None}


def run(cfg: DictConfig) -> dict:
    """Export as configured; returns the manifest written."""
    for key in ("checkpoint", "output"):
        if OmegaConf.is_missing(cfg, key) or not cfg[key]:
            fail(f"no {key} given: add {key}={'PATH' if key == 'checkpoint' else 'DIR'}")
    check_types(cfg, OPTION_TYPES)
    # The format's own options, and any other format's that the command line changed (refused).
    defaults = OmegaConf.load(CONFIG_DIR / "export.yaml")
    chosen = FORMATS.get(cfg.format)
    options = {key: cfg[key] for format in FORMATS.values() for key in format.options
               if (chosen is not None and key in chosen.options) or cfg[key] != defaults[key]}
    try:
        chosen = export_format(cfg.format, options)
        check_quantize_mode(cfg.quantize)
    except (ExportError, ValueError) as error:
        fail(error)
    if not Path(cfg.checkpoint).is_file():
        fail(f"checkpoint not found: {cfg.checkpoint}")
    # torch loads from here on: a bad option or a mistyped path above is refused without it.
    import importlib.util

    from seq2seq.checkpoint import CheckpointError

    missing = [name for name in chosen.packages if importlib.util.find_spec(name) is None]
    if missing:
        fail(f"format={cfg.format} needs the {chosen.extra} extra ({', '.join(missing)} "
             f"missing): pip install '.[{chosen.extra}]'")

    started = time.perf_counter()
    log.info("exporting %s to %s (format=%s%s)", cfg.checkpoint, cfg.output, cfg.format,
             f", quantize={cfg.quantize}" if "quantize" in chosen.options else "")
    try:
        manifest = export_checkpoint(cfg.checkpoint, cfg.output, format=cfg.format,
                                     overwrite=cfg.overwrite, **options)
    except (CheckpointError, ExportError) as error:
        fail(error)
    except OSError as error:
        fail(f"cannot write {cfg.output}: {error.strerror or error}")
    if cfg.format == "argos":
        log.info("the Argos package: %s", Path(cfg.output, manifest["argos"]["package"]))
    size = sum(f.stat().st_size for f in Path(cfg.output).rglob("*") if f.is_file())
    log.info("wrote %s (%.1f MB) in %.1fs; %s", cfg.output, size / 1e6,
             time.perf_counter() - started, chosen.usage.format(output=cfg.output))
    return manifest


# ``python export.py``: see the module docstring (``--help`` lists the options).
# package_version as written: Hydra would read 1.10 as the number 1.1.
main = hydra_tool(run, config_name="export", summary=__doc__.splitlines()[0],
                  literal_keys=("package_version",))


if __name__ == "__main__":
    main()
