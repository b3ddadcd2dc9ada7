"""Plot validation BLEU against training time for one or more runs, from their TensorBoard logs.

    seq2seq-plot-curves runs/multi30k_gru_additive runs/multi30k_luong_fast \\
        --output docs/learning_curve.png

The x axis is wall-clock minutes since the run's first logged event (validation time
included); each point is one validation (greedy decoding of the whole validation set). A run
folder without validation scores is a one-line ``error: ...`` and exit status 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from seq2seq.config_types import error_reason


class CurveError(Exception):
    """A run folder with no validation BLEU to plot."""


def validation_curve(run_dir: Path) -> tuple[list[float], list[float]]:
    """(minutes since the run's first event, validation BLEU) of each validation of a run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logs = run_dir / "tensorboard"
    if not logs.is_dir():
        raise CurveError(f"{run_dir}: no tensorboard/ folder (is it a run folder?)")
    events = EventAccumulator(str(logs), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    if "valid/bleu" not in tags:
        raise CurveError(f"{run_dir}: no valid/bleu scalars in {logs}")
    start = min(events.Scalars(tag)[0].wall_time for tag in tags)
    points = events.Scalars("valid/bleu")
    return [(p.wall_time - start) / 60 for p in points], [p.value for p in points]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="seq2seq-plot-curves",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders")
    parser.add_argument("--output", type=Path, default=Path("learning_curve.png"))
    args = parser.parse_args(argv)
    try:
        curves = {run: validation_curve(run) for run in args.runs}
    except CurveError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1

    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=120)
    for run, (minutes, bleu) in curves.items():
        axes.plot(minutes, bleu, marker="o", markersize=3, label=run.name)
    axes.set_xlabel("minutes since start (training + validation)")
    axes.set_ylabel("validation BLEU (greedy, sacreBLEU)")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    try:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(args.output)
    except OSError as error:
        print(f"error: cannot write {args.output}: {error.strerror or error}", file=sys.stderr)
        return 1
    except ValueError as error:  # an extension matplotlib cannot write
        print(f"error: {args.output}: {error_reason(error)}", file=sys.stderr)
        return 1
    finally:
        plt.close(figure)
    print(f"written {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
