"""A run folder is never silently reused: continue it, start it over, or choose another.

Training into a folder that already holds a run would replace its ``best.pt`` and ``last.pt``,
leave its ``step*.pt`` beside the new model's and append to its ``train.log``. So a folder
that holds a run needs ``trainer.resume=auto`` (continue it) or ``trainer.overwrite=true``
(remove the old run's files first); anything else is refused before the folder changes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

# What a training run writes into its folder (seq2seq.training.trainer's module docstring),
# plus the reports derived from it. Only these names are removed by trainer.overwrite=true, and
# only in a folder that holds a run: one with a training run's own folders (MARKERS) or its
# config.yaml beside Hydra's snapshot.
MARKERS = ("checkpoints", "validation", "tensorboard")
RUN_FILES = ("config.yaml",)
RUN_FOLDERS = (*MARKERS, "eval", ".hydra")
LOG_NAME = "train.log"
# trainer.resume values that ask for no resumption.
NO_RESUME = (None, "", "null", "none")


class RunFolderError(ValueError):
    """The run folder cannot be used as asked; the message says how to go on, in one line."""


def holds_run(folder: Path) -> bool:
    """Whether ``folder`` holds (part of) an earlier training run. A failed start that wrote
    only Hydra's snapshot and its log is not one: the corrected command may use the folder."""
    folder = Path(folder)
    return (any((folder / name).is_dir() for name in MARKERS)
            or ((folder / "config.yaml").is_file() and (folder / ".hydra").is_dir()))


def _continues_this_run(resume: str | None, folder: Path) -> bool:
    """``trainer.resume`` asks to continue the run in ``folder`` (auto, or a path inside it)."""
    if resume in NO_RESUME:
        return False
    if resume == "auto":
        return True
    return Path(folder).resolve() in (Path(resume).resolve(), *Path(resume).resolve().parents)


def claim_run_folder(folder: Path, *, resume: str | None, overwrite: bool) -> list[str]:
    """Make ``folder`` ready for a run; returns the names removed (``overwrite``), else [].

    ``train.log`` is emptied, not removed: the log file handler of this run is already open
    on it.

    Raises:
        RunFolderError: the folder holds a run and neither ``resume`` continues it nor
            ``overwrite`` is set; both are set; or ``resume=auto`` finds checkpoints but no
            ``last.pt`` (starting afresh would leave them beside the new run's).
    """
    folder = Path(folder)
    continues = _continues_this_run(resume, folder)
    if overwrite and continues:
        raise RunFolderError(f"trainer.overwrite=true and trainer.resume={resume} contradict each "
                             "other: continue the run or start it over, not both")
    if not holds_run(folder):
        return []
    if continues:
        checkpoints = folder / "checkpoints"
        if (resume == "auto" and not (checkpoints / "last.pt").is_file()
                and checkpoints.is_dir() and any(checkpoints.glob("*.pt"))):
            raise RunFolderError(
                f"{folder} holds checkpoints of a run but no checkpoints/last.pt to continue "
                "from; start it over with trainer.overwrite=true (they are deleted), or give "
                "another hydra.run.dir")
        return []
    if not overwrite:
        raise RunFolderError(
            f"{folder} already holds a training run; continue it with trainer.resume=auto, "
            "start it over with trainer.overwrite=true (its checkpoints are deleted), or give "
            "another hydra.run.dir")
    removed = []
    for name in RUN_FOLDERS + RUN_FILES:
        path = folder / name
        if path.is_dir():
            shutil.rmtree(path)
            removed.append(name + "/")
        elif path.exists():
            path.unlink()
            removed.append(name)
    log = folder / LOG_NAME
    if log.is_file() and log.stat().st_size > 0:
        with open(log, "r+b") as file:
            file.truncate(0)
        removed.append(LOG_NAME)
    return removed
