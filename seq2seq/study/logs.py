"""What a run's TensorBoard log says about its training: speed, steps, the BLEU curve.

The trainer writes scalars to ``RUN/tensorboard/`` (``train/tokens_per_sec`` every
``log_every`` steps, ``valid/bleu`` at every validation, ...). Minutes are measured from the
wall time of the run's first event of any scalar (the first training log), so they count
training (validation included), not the data preparation and model building before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TrainingLog:
    """Summary of one run's TensorBoard scalars: ``tokens_per_second``, the mean of the logged
    ``train/tokens_per_sec`` (target tokens per second; NaN when none was logged); ``steps``, the
    largest step of any scalar (0 when none); ``bleu_curve`` and ``bleu_steps``, ``(minutes,
    BLEU)`` and ``(step, BLEU)`` of every validation, in order."""

    tokens_per_second: float = math.nan
    steps: int = 0
    bleu_curve: list[tuple[float, float]] = field(default_factory=list)
    bleu_steps: list[tuple[int, float]] = field(default_factory=list)


def read_training_log(run_dir: str | Path) -> TrainingLog:
    """Read ``run_dir/tensorboard``; an absent or empty log gives an empty :class:`TrainingLog`."""
    folder = Path(run_dir) / "tensorboard"
    if not folder.is_dir():
        return TrainingLog()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # size_guidance 0: keep every event (the default keeps a sample of 1,000 scalars).
    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    accumulator.Reload()
    tags = accumulator.Tags().get("scalars", [])
    events = {tag: accumulator.Scalars(tag) for tag in tags}
    if not events or not any(events.values()):
        return TrainingLog()
    start = min(e.wall_time for values in events.values() for e in values)
    steps = max(e.step for values in events.values() for e in values)
    speeds = [e.value for e in events.get("train/tokens_per_sec", [])]
    curve = [((e.wall_time - start) / 60.0, float(e.value)) for e in events.get("valid/bleu", [])]
    return TrainingLog(
        tokens_per_second=sum(speeds) / len(speeds) if speeds else math.nan,
        steps=int(steps),
        bleu_curve=sorted(curve),
        bleu_steps=sorted((int(e.step), float(e.value)) for e in events.get("valid/bleu", [])),
    )
