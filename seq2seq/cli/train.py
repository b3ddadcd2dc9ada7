"""``python train.py [overrides]`` / ``seq2seq-train``: train a model.

Examples::

    python train.py                                   # Multi30k de-en, the default model
    python train.py model/attention=dot model/encoder=lstm trainer.max_epochs=5
    python train.py experiment=multi30k_luong_fast
    python train.py --cfg job                         # print the composed config
    python train.py hydra.run.dir=runs/a trainer.resume=auto   # continue runs/a

Several GPUs or machines (each rank reads its own shard of every batch list)::

    torchrun --standalone --nproc_per_node=4 train.py hydra.run.dir=runs/ddp
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from seq2seq.cli import CONFIG_DIR

log = logging.getLogger("seq2seq.train")


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def main(cfg: DictConfig) -> float | None:
    from seq2seq.checkpoint import CheckpointError
    from seq2seq.data.corpus import DataError
    from seq2seq.training.run import train
    from seq2seq.training.trainer import TrainingError

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        result = train(cfg, run_dir)
    except (DataError, CheckpointError, TrainingError, ValueError) as error:
        log.error("%s", error)
        sys.exit(1)
    log.info("run folder: %s", run_dir)
    return result["best_bleu"]  # what a Hydra sweeper would optimise


if __name__ == "__main__":
    main()
