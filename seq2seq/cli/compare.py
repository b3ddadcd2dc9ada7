"""``python compare.py RUN_OR_SWEEP_DIR [...] [key=value ...]`` / ``seq2seq-compare``: compare
training runs.

The bare arguments are run folders, folders holding run folders (a Hydra multirun folder
``multirun/DATE/TIME``, wherever a launcher put the runs) or quoted globs (the ``runs`` option);
``key=value`` arguments are options, as in every tool (``seq2seq/configs/compare.yaml``, with
the decoding group's beam search settings)::

    python compare.py multirun/2026-11-22/07-10-00 split=test beam_size=5
    python compare.py outputs/a outputs/b 'outputs/2026-11-*/*' output_dir=reports/attn
    python compare.py runs/attention_study records_dir=docs/attention_study/runs
    python compare.py docs/attention_study/runs output_dir=docs/attention_study

A run record (``*.run.json.gz``, written with ``records_dir=``) is a scored run kept without
its folder and checkpoint: given alone or beside run folders, it counts as a complete run.

Prints the table (markdown) on stdout, then one ``failed: RUN (GROUP): reason`` line per run that
could not be scored; logs go to stderr. Bad options, no run folder, or no run that could be
scored: one line ``error: ...`` on stderr, exit status 1.
"""

from __future__ import annotations

import logging
from dataclasses import fields

from omegaconf import DictConfig, OmegaConf

from seq2seq.cli.app import hydra_tool
from seq2seq.cli.common import fail
from seq2seq.cli.decoding_request import check_config, refuse_unused, start_decoding
from seq2seq.config_types import ConfigError, check_value

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
    for key, annotation in OPTION_TYPES.items():
        try:
            check_value(cfg[key], annotation, key)
        except ConfigError as error:
            fail(error)
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
