"""``python compare.py SWEEP_DIR [key=value ...]`` / ``seq2seq-compare``: compare training runs.

Positional arguments are run folders, folders holding run folders (a Hydra multirun folder
``multirun/DATE/TIME``, wherever a launcher put the runs) or quoted globs; ``key=value``
arguments are options (Hydra-style, in any order)::

    python compare.py multirun/2026-11-22/07-10-00 split=test beam_size=5
    python compare.py outputs/a outputs/b 'outputs/2026-11-*/*' output_dir=reports/attn
    python compare.py runs/attention_study records_dir=docs/attention_study/runs
    python compare.py docs/attention_study/runs output_dir=docs/attention_study

A run record (``*.run.json.gz``, written with ``records_dir=``) is a scored run kept without
its folder and checkpoint: given alone or beside run folders, it counts as a complete run.

Options: ``python compare.py --help`` lists each with its default (:func:`option_help`).

Prints the table (markdown) on stdout, then one ``failed: RUN (GROUP): reason`` line per run that
could not be scored; logs go to stderr. Bad options, no run folder, or no run that could be
scored: one line ``error: ...`` on stderr, exit status 1.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from seq2seq.cli.common import fail, set_up_decoding

log = logging.getLogger("seq2seq.compare")

USAGE = "usage: compare.py RUN_OR_SWEEP_DIR [...] [split=test] [beam_size=5] [output_dir=DIR] ..."
_EXTRA_OPTIONS: dict[str, Any] = {
    "num_threads": None, "output_dir": None, "test": "bs", "samples": 0, "refresh": False,
    "plots": True, "aso_iterations": 1000, "records_dir": None,
}
# What each option does, in one line: the source of --help (docs/configuration.md gives the
# same defaults, checked by tests/test_docs.py); the decoding options' are DecodeOptions'.
_OWN_HELP: dict[str, str] = {
    "split": "valid | test: the split of each run's own data config",
    "max_source_length": "longer sources are cut to this many pieces",
    "max_tokens": "padded source ids per decoding batch (also batch.max_tokens)",
    "precision": "fp32 | bf16 | fp16 | auto: autocast during the decoding",
    "device": "auto (CUDA, then MPS, then CPU) | cpu | cuda | cuda:N | mps",
    "heatmap_sentence": "the line of the split (from 0) drawn in the heatmaps",
    "probes": "the faithfulness probe: decode again with uniform and with shifted attention "
              "weights (two more decodings per run)",
    "num_threads": "CPU threads for torch; null: torch's default",
    "output_dir": "where comparison.{md,csv,json} and the PNGs go; null: the runs' deepest "
                  "common parent folder",
    "test": "sentence-level significance test: bs (paired bootstrap) | ar (approximate "
            "randomization) | none",
    "samples": "resamples or trials; 0: sacreBLEU's default (1,000 bs, 10,000 ar)",
    "aso_iterations": "bootstrap iterations of the significance over seeds (Almost Stochastic "
                      "Order between every pair of groups); 0: skip it",
    "records_dir": "also write each scored run folder's record (scores, curve, config; about "
                   "30 kB) there",
    "refresh": "score again runs whose cached scores are still valid",
    "plots": "draw the PNGs",
}


def _decoding_options() -> dict[str, tuple[Any, Any, str]]:
    """(type, default, help) of the decoding options compare.py sets, by name."""
    from seq2seq.inference.decode_options import described_options
    from seq2seq.study.scoring import SCORED_OPTIONS

    described = described_options()
    return {name: described[name] for name in SCORED_OPTIONS}


def option_defaults() -> dict[str, Any]:
    from seq2seq.study.scoring import ScoringOptions

    own = {f.name: f.default for f in fields(ScoringOptions) if f.name != "decoding"}
    decoding = {name: default for name, (_, default, _) in _decoding_options().items()}
    return {"split": own.pop("split"), **decoding, **own} | _EXTRA_OPTIONS


def option_help() -> dict[str, str]:
    """What each option does, by name."""
    return _OWN_HELP | {name: meaning for name, (_, _, meaning) in _decoding_options().items()}


def help_text(width: int = 100) -> str:
    """``--help``: the usage, then every option with what it does and its default."""
    from seq2seq.cli.help import format_value, two_columns

    lines = [USAGE, "", __doc__.split("\n\nOptions:")[0].strip(), "", "Options (key=value):"]
    meanings = option_help()
    lines += two_columns([(name, f"{meanings[name]} [default {format_value(default)}]")
                          for name, default in option_defaults().items()], width)
    return "\n".join(lines) + "\n"


def _convert(key: str, text: str, default: Any) -> Any:
    if text.lower() in ("null", "none", "~") and (default is None or key == "num_threads"):
        return None
    kind = type(default)
    if kind is bool or key in ("refresh", "plots"):
        if text.lower() in ("true", "yes", "1"):
            return True
        if text.lower() in ("false", "no", "0"):
            return False
        fail(f"{key}: expected true or false, got {text!r}")
    if kind in (int, float) or key == "num_threads":
        try:
            return float(text) if kind is float else int(text)
        except ValueError:
            fail(f"{key}: expected {'a number' if kind is float else 'an integer'}, got {text!r}")
    return text


def parse_arguments(argv: Sequence[str]) -> tuple[list[str], dict[str, Any]]:
    """Split ``argv`` into run specs and typed options; exits with one line on bad options."""
    defaults = option_defaults()
    specs: list[str] = []
    options = dict(defaults)
    for argument in argv:
        if argument in ("-h", "--help"):
            print(help_text(), end="")
            sys.exit(0)
        key, sep, value = argument.partition("=")
        key = key.removeprefix("+").removeprefix("batch.")  # batch.max_tokens as in evaluate.py
        if sep and key.isidentifier():
            if key not in defaults:
                from seq2seq.cli.app import did_you_mean

                fail(f"{argument.partition('=')[0].lstrip('+')} is not an option of compare.py"
                     f"{did_you_mean(key, defaults)}; --help lists them")
            options[key] = _convert(key, value, defaults[key])
        elif argument.startswith("-"):
            fail(f"unknown flag {argument!r}; {USAGE}")
        else:
            specs.append(argument)
    if options["split"] not in ("valid", "test"):
        fail(f"split must be valid or test, got {options['split']!r}")
    if options["aso_iterations"] < 0:
        fail(f"aso_iterations must be 0 (skip) or more, got {options['aso_iterations']}")
    if options["test"] not in ("bs", "ar", "none"):
        fail(f"test must be bs, ar or none, got {options['test']!r}")
    if not specs:
        fail(f"no run folder given; {USAGE}")
    return specs, options


def run(argv: Sequence[str]):
    """Compare the runs ``argv`` names; returns the :class:`~seq2seq.study.comparison.Comparison`."""
    specs, options = parse_arguments(argv)
    from seq2seq.checkpoint import CheckpointError
    from seq2seq.data.text_files import DataError
    from seq2seq.inference.decode_options import DecodeOptions
    from seq2seq.study.comparison import compare
    from seq2seq.study.runs import StudyError
    from seq2seq.study.scoring import SCORED_OPTIONS, ScoringOptions

    try:
        decoding = DecodeOptions.of({name: options[name] for name in SCORED_OPTIONS})
    except ValueError as error:
        fail(error)
    scoring = ScoringOptions(decoding=decoding, **{
        f.name: options[f.name] for f in fields(ScoringOptions) if f.name != "decoding"})
    set_up_decoding(options["num_threads"])
    try:
        comparison = compare(
            specs, scoring, output_dir=options["output_dir"], test=options["test"],
            samples=options["samples"], refresh=options["refresh"], plots=options["plots"],
            aso_iterations=options["aso_iterations"], records_dir=options["records_dir"],
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


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point (``seq2seq-compare``)."""
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s] %(message)s",
                        stream=sys.stderr)
    for noisy in ("sacrebleu", "tensorboard"):  # per-metric and per-file INFO lines
        logging.getLogger(noisy).setLevel(logging.WARNING)
    run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
