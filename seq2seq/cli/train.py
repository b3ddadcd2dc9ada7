"""``python train.py [overrides]`` / ``seq2seq-train``: train a model.

Examples, the run folder (one that holds a run is refused, nothing in it changed, without
``trainer.resume=auto`` or ``trainer.overwrite=true``) and torchrun on several GPUs or
machines (each rank reads its own shard of every batch list): docs/training.md.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from seq2seq.cli.app import hydra_tool
from seq2seq.cli.common import fail
from seq2seq.config_types import error_reason
from seq2seq.console import keep_file_only_records_off_console
from seq2seq.onednn_caches import bound_onednn_caches
from seq2seq.training.run_folder import LOG_NAME, RunFolderError, claim_run_folder

log = logging.getLogger("seq2seq.train")


def _quiet_other_ranks() -> None:
    """Under torchrun only rank 0 writes the log file and prints INFO lines."""
    if _rank() == 0:
        return
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler):
            root.removeHandler(handler)
    root.setLevel(logging.WARNING)


def _shared_run_dir_for_torchrun() -> None:
    """Give all torchrun ranks one run folder (each would otherwise stamp its own ${now})."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "SEQ2SEQ_RUN_DIR" not in os.environ:
        run_id = os.environ.get("TORCHELASTIC_RUN_ID", "run")
        os.environ["SEQ2SEQ_RUN_DIR"] = f"outputs/torchrun-{run_id}"


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _refuse(error: BaseException, run_dir: Path) -> NoReturn:
    """A one-line error on stderr, before the run folder is claimed: nothing is written into
    it (an earlier run's train.log stays as it was), and what Hydra's logging set-up made, an
    empty train.log and the folders then empty, is removed."""
    log_file = run_dir / LOG_NAME
    if log_file.is_file() and log_file.stat().st_size == 0:
        log_file.unlink()
        # The folders Hydra made for it, up to the working folder (outputs/DATE/TIME).
        cwd, folder = Path.cwd().resolve(), run_dir.resolve()
        while folder != cwd and cwd in folder.parents and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent
    fail(error)


def _claim_run_folder(cfg: DictConfig, run_dir: Path) -> None:
    """Refuse a folder that holds another run, or empty it (trainer.overwrite=true); then write
    the Hydra snapshot (.hydra/) that Hydra itself is told not to write (train.yaml)."""
    if _rank() != 0:
        return  # rank 0 speaks for the shared folder
    trainer = cfg.get("trainer") or {}
    try:
        removed = claim_run_folder(run_dir, resume=trainer.get("resume"),
                                   overwrite=trainer.get("overwrite") is True)
    except RunFolderError as error:
        _refuse(error, run_dir)
    if removed:
        log.info("trainer.overwrite=true: removed the earlier run's %s from %s",
                 ", ".join(removed), run_dir)
    snapshot = run_dir / ".hydra"
    snapshot.mkdir(parents=True, exist_ok=True)
    hydra_config = HydraConfig.get()
    OmegaConf.save(cfg, snapshot / "config.yaml")
    OmegaConf.save(OmegaConf.create({"hydra": hydra_config}), snapshot / "hydra.yaml")
    OmegaConf.save(hydra_config.overrides.task, snapshot / "overrides.yaml")


def run(cfg: DictConfig) -> float | None:
    """Train as configured in the run folder Hydra made; returns the best validation BLEU
    (what a Hydra sweeper would optimise)."""
    from hydra.errors import InstantiationException
    from omegaconf.errors import OmegaConfBaseException

    from seq2seq.checkpoint import CheckpointError
    from seq2seq.data.text_files import DataError
    from seq2seq.training.run import check_train_config, train
    from seq2seq.training.trainer import TrainingError

    _quiet_other_ranks()
    keep_file_only_records_off_console()  # the model printout, loss lines under a bar
    hydra_config = HydraConfig.get()
    run_dir = Path(hydra_config.runtime.output_dir)
    overrides = list(hydra_config.overrides.task)  # held against a fine-tuning parent's model
    try:  # every value checked before the folder is claimed (a typo never costs a run)
        check_train_config(OmegaConf.to_container(cfg, resolve=True), overrides, run_dir)
    except (ValueError, InstantiationException, OmegaConfBaseException) as error:
        _refuse(error, run_dir)
    _claim_run_folder(cfg, run_dir)
    try:
        result = train(cfg, run_dir, overrides)
    except (DataError, CheckpointError, TrainingError, ValueError, InstantiationException,
            OmegaConfBaseException) as error:
        # Bad input of any kind is one line that says what is wrong (the config key, the
        # file); the traceback is shown with hydra.verbose=true.
        log.debug("details", exc_info=True)
        log.error("%s", error_reason(error))
        sys.exit(1)
    log.info("run folder: %s", run_dir)
    return result["best_bleu"]  # what a Hydra sweeper would optimise


def _exit_torchrun_rank() -> None:
    """End a torchrun rank that finished its work without the interpreter's teardown.

    Once DistributedDataParallel has wrapped a model, the gloo process group outlives
    ``destroy_process_group`` (its worker threads were still running after it, the wrapper
    deleted and collected, under torch 2.13), so it is torn down with the interpreter at exit,
    where a rank was seen to abort ("terminate called without an active exception") after
    a complete run. Everything is written and closed by now: flush and leave.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


train_main = hydra_tool(run, config_name="train", strict=False,
                        summary="Train a translation model (a run folder: checkpoints, "
                                "train.log, TensorBoard).")


def main() -> None:
    """``python train.py``: see the module docstring (``--help`` lists the options)."""
    bound_onednn_caches()  # before any matrix product of this process (its docstring says why)
    _shared_run_dir_for_torchrun()
    train_main()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _exit_torchrun_rank()


if __name__ == "__main__":
    main()
