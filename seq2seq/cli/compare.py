"""``python compare.py RUN_OR_SWEEP_DIR [...] [key=value ...]`` / ``seq2seq-compare``: compare
training runs.

The bare arguments are run folders, folders of run folders (a Hydra multirun folder), quoted
globs or run records (``*.run.json.gz``); ``key=value`` arguments are the options of
``seq2seq/configs/compare.yaml``. What it prints and writes: docs/compare.md. Bad options, no
run folder, or no run that could be scored: one line ``error: ...`` on stderr, exit status 1.
"""

from __future__ import annotations

import logging
from dataclasses import fields

from omegaconf import DictConfig, OmegaConf

from seq2seq.cli.app import hydra_tool
from seq2seq.cli.common import check_types, fail
from seq2seq.cli.decoding_request import check_config, refuse_unused, start_decoding

log = logging.getLogger("seq2seq.compare")

# The decoding group's options a comparison does not read: every run is scored alike, with beam
# search and the whole vocabulary.
UNUSED = ("search", "nbest", "temperature", "top_k", "top_p", "epsilon", "seed", "quantize",
          "shortlist", "terms", "terms_ignore_case")
OPTION_TYPES = {"split": str, "heatmap_sentence": int, "probes": bool, "output_dir": str | None,
                "test": str, "samples": int, "aso_iterations": int, "records_dir": str | None,
                "refresh": bool, "plots": bool}


def run(cfg: DictConfig):
    """Compare the runs ``cfg.runs`` names; returns the :class:`~seq2seq.study.comparison.Comparison`."""
    check_config(cfg)
    check_types(cfg, OPTION_TYPES)
    if OmegaConf.is_missing(cfg, "runs") or not cfg.runs:
        fail("no run folder given: python compare.py RUN_OR_SWEEP_DIR [...] [key=value ...]")
    refuse_unused(cfg, UNUSED, "compare.py scores every run's best.pt alike, with beam search")
    if cfg.split not in ("valid", "test"):
        fail(f"split must be valid or test, got {cfg.split!r}")
    if cfg.aso_iterations < 0:
        fail(f"aso_iterations must be 0 (skip) or more, got {cfg.aso_iterations}")
    if cfg.test not in ("bs", "ar", "none"):
        fail(f"test must be bs, ar or none, got {cfg.test!r}")
    specs = [str(spec) for spec in cfg.runs] if OmegaConf.is_list(cfg.runs) else [str(cfg.runs)]
    request = start_decoding(cfg)
    from seq2seq.checkpoint import CheckpointError
    from seq2seq.data.text_files import DataError
    from seq2seq.study.comparison import compare
    from seq2seq.study.runs import StudyError
    from seq2seq.study.scoring import ScoringOptions

    settings = {"max_tokens": cfg.batch.max_tokens, **{
        f.name: cfg[f.name] for f in fields(ScoringOptions) if f.name in cfg}}
    scoring = ScoringOptions(**{**settings, "decoding": request.options})
    try:
        comparison = compare(
            specs, scoring, output_dir=cfg.output_dir, test=cfg.test, samples=cfg.samples,
            refresh=cfg.refresh, plots=cfg.plots, aso_iterations=cfg.aso_iterations,
            records_dir=cfg.records_dir,
        )
    except (StudyError, CheckpointError, DataError, ValueError, OSError) as error:
        fail(error)
    print(comparison.table)
    for failure in comparison.failed:
        print(f"failed: {failure['run']} ({failure['group']}): {failure['reason']}")
    print(f"written: {', '.join(str(p) for p in comparison.files)}", flush=True)
    if not any(row.runs for row in comparison.rows):
        fail(f"none of the {len(comparison.failed)} runs could be scored (listed above)")
    return comparison


# ``python compare.py``: see the module docstring (``--help`` lists the options); the bare
# arguments are the runs.
main = hydra_tool(run, config_name="compare", summary=__doc__.splitlines()[0], bare="runs")


if __name__ == "__main__":
    main()
