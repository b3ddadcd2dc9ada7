"""Plot validation BLEU against training time for one or more runs, from their TensorBoard logs.

    python scripts/plot_learning_curve.py runs/multi30k_gru_additive runs/multi30k_luong_fast \\
        --output docs/learning_curve.png

The x axis is wall-clock minutes since the run's first logged event (validation time
included); each point is one validation (greedy decoding of the whole validation set).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def validation_curve(run_dir: Path) -> tuple[list[float], list[float]]:
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    if "valid/bleu" not in tags:
        raise SystemExit(f"{run_dir}: no valid/bleu scalars in {run_dir / 'tensorboard'}")
    start = min(events.Scalars(tag)[0].wall_time for tag in tags)
    points = events.Scalars("valid/bleu")
    return [(p.wall_time - start) / 60 for p in points], [p.value for p in points]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders")
    parser.add_argument("--output", type=Path, default=Path("learning_curve.png"))
    args = parser.parse_args()
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=120)
    for run in args.runs:
        minutes, bleu = validation_curve(run)
        axes.plot(minutes, bleu, marker="o", markersize=3, label=run.name)
    axes.set_xlabel("minutes since start (training + validation)")
    axes.set_ylabel("validation BLEU (greedy, sacreBLEU)")
    axes.set_title("Multi30k de-en, 2-core CPU")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.output)
    plt.close(figure)
    print(f"written {args.output}")


if __name__ == "__main__":
    main()
