"""Plot validation BLEU against training time for one or more runs, from their TensorBoard logs.

    seq2seq-plot-curves runs/multi30k_gru_additive runs/multi30k_luong_fast \\
        --output docs/learning_curve.png

The x axis is wall-clock minutes since the run's first logged event (validation time
included); each point is one validation (greedy decoding of the whole validation set), drawn
by :func:`seq2seq.study.plots.plot_bleu_curves` as the comparison draws its own. A run folder
without validation scores is a one-line ``error: ...`` and exit status 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from seq2seq.config_types import error_reason


class CurveError(Exception):
    """A run folder with no validation BLEU to plot."""


def validation_curve(run_dir: Path) -> list[tuple[float, float]]:
    """(minutes since the run's first event, validation BLEU) of each validation of a run."""
    from seq2seq.study.logs import read_training_log

    logs = run_dir / "tensorboard"
    if not logs.is_dir():
        raise CurveError(f"{run_dir}: no tensorboard/ folder (is it a run folder?)")
    curve = read_training_log(run_dir).bleu_curve
    if not curve:
        raise CurveError(f"{run_dir}: no valid/bleu scalars in {logs}")
    return curve


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="seq2seq-plot-curves",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders")
    parser.add_argument("--output", type=Path, default=Path("learning_curve.png"),
                        help="the figure to write, in the format its extension names")
    args = parser.parse_args(argv)
    # Each run by its folder's name, or its path where two names are the same.
    names = [run.name for run in args.runs]
    labels = [name if names.count(name) == 1 else str(run)
              for name, run in zip(names, args.runs, strict=True)]
    try:
        curves = {label: [validation_curve(run)]
                  for label, run in zip(labels, args.runs, strict=True)}
    except CurveError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    from seq2seq.study.plots import plot_bleu_curves

    try:
        plot_bleu_curves(args.output, curves,
                         x_label="minutes since start (training + validation)")
    except OSError as error:
        print(f"error: cannot write {args.output}: {error.strerror or error}", file=sys.stderr)
        return 1
    except ValueError as error:  # an extension matplotlib cannot write
        print(f"error: {args.output}: {error_reason(error)}", file=sys.stderr)
        return 1
    print(f"written {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
