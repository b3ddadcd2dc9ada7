"""``seq2seq-plot-curves RUN [...] [output=FIGURE]``: plot validation BLEU against training
time for one or more runs, from their TensorBoard logs.

    seq2seq-plot-curves runs/multi30k_gru_additive runs/multi30k_luong_fast \\
        output=docs/learning_curve.png

The x axis is wall-clock minutes since the run's first logged event (validation time
included); each point is one validation (greedy decoding of the whole validation set), drawn
by :func:`seq2seq.study.plots.plot_bleu_curves` as the comparison draws its own. A run folder
without validation scores is a one-line ``error: ...`` and exit status 1. The previous release's
``--output FIGURE`` still works, with a warning.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from seq2seq.cli.app import hydra_tool
from seq2seq.cli.common import checkpoint_paths, fail
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


def run(cfg: DictConfig) -> None:
    """Plot as configured."""
    if OmegaConf.is_missing(cfg, "runs") or not cfg.runs:
        fail("no run folder given: seq2seq-plot-curves RUN [...] [output=FIGURE]")
    runs, output = [Path(run) for run in checkpoint_paths(cfg.runs)], Path(cfg.output)
    # Each run by its folder's name, or its path where two names are the same.
    names = [run.name for run in runs]
    labels = [name if names.count(name) == 1 else str(run)
              for name, run in zip(names, runs, strict=True)]
    try:
        curves = {label: [validation_curve(run)] for label, run in zip(labels, runs, strict=True)}
    except CurveError as error:
        fail(error)
    from seq2seq.study.plots import plot_bleu_curves

    try:
        plot_bleu_curves(output, curves, x_label="minutes since start (training + validation)")
    except OSError as error:
        fail(f"cannot write {output}: {error.strerror or error}")
    except ValueError as error:  # an extension matplotlib cannot write
        fail(f"{output}: {error_reason(error)}")
    print(f"written {output}")


main = hydra_tool(run, config_name="plot_curves", summary=__doc__.splitlines()[0], bare="runs",
                  old_flags={"--output": "output"})


if __name__ == "__main__":
    main()
