"""Plot validation BLEU against training time for one or more runs, from their TensorBoard logs.

    seq2seq-plot-curves runs/multi30k_gru_additive runs/multi30k_luong_fast \\
        --output docs/learning_curve.png

The x axis is wall-clock minutes since the run's first logged event (validation time
included); the curve joins the validations (greedy decoding of the whole validation set),
drawn by :func:`seq2seq.study.plots.plot_bleu_curves` as the comparison draws its own. A run
folder without validation scores is a one-line ``error: ...`` and exit status 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


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
                        help="the PNG file to write")
    args = parser.parse_args(argv)
    if args.output.suffix.lower() != ".png":
        print(f"error: {args.output}: the figure is a PNG file (--output NAME.png)",
              file=sys.stderr)
        return 1
    try:
        curves = {run.name: [validation_curve(run)] for run in args.runs}
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
    print(f"written {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
