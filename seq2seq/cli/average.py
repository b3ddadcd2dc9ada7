"""``seq2seq-average CHECKPOINT [...] output=PATH``: average the parameters of several
checkpoints of one model into a new checkpoint.

Checkpoints of other models (parameter names and shapes, tokenizers) are refused with a one-line
``error: ...`` naming the first difference, exit status 1. What the result keeps:
:mod:`seq2seq.training.averaging`; an example: docs/evaluate-translate.md, "Averaging
checkpoints". The previous release's ``--output PATH`` still works, with a warning.
"""

from __future__ import annotations

import sys

from omegaconf import DictConfig, OmegaConf

from seq2seq.cli.app import hydra_tool
from seq2seq.cli.common import checkpoint_paths, fail


def run(cfg: DictConfig) -> None:
    """Average as configured."""
    for key in ("checkpoints", "output"):
        if OmegaConf.is_missing(cfg, key) or not cfg[key]:
            fail(f"no {key} given: seq2seq-average CHECKPOINT [...] output=PATH")
    paths = checkpoint_paths(cfg.checkpoints)
    from seq2seq.checkpoint import CheckpointError, save_checkpoint
    from seq2seq.training.averaging import average_checkpoints

    try:
        save_checkpoint(average_checkpoints(paths), cfg.output)
    except CheckpointError as error:
        fail(error)
    except OSError as error:
        fail(f"cannot write {cfg.output}: {error.strerror or error}")
    print(f"averaged {len(paths)} checkpoints into {cfg.output}", file=sys.stderr)


main = hydra_tool(run, config_name="average", summary=__doc__.splitlines()[0],
                  bare="checkpoints", old_flags={"--output": "output"})


if __name__ == "__main__":
    main()
