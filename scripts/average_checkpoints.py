"""Average the parameters of several checkpoints of one model into a new checkpoint.

    python scripts/average_checkpoints.py runs/x/checkpoints/step*.pt --output runs/x/checkpoints/avg.pt

Averaging the last few checkpoints of a run usually gives a slightly better and more stable
model than any one of them. The checkpoints must come from the same model: the same
parameter names and shapes and the same tokenizers, or the script refuses with a message
naming the first difference. The output keeps the first checkpoint's config and tokenizers,
drops the training state (optimizer, schedule, RNG, ...), lists its sources under
``averaged_from``, and loads like any other checkpoint (``evaluate.py``, ``translate.py``).

Floating-point entries are averaged in float64 and stored in their original dtype; integer
entries (none in the standard models) are taken from the first checkpoint. The averaging is
:func:`seq2seq.averaging.average_checkpoints`; ``trainer.average_last=N`` does the same for
the last N validations of a run at the end of training.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from seq2seq.averaging import average_checkpoints
from seq2seq.checkpoint import CheckpointError, save_checkpoint


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+", help="checkpoint files of one model")
    parser.add_argument("--output", required=True, help="where to write the averaged checkpoint")
    args = parser.parse_args(argv)
    try:
        payload = average_checkpoints(args.checkpoints)
        save_checkpoint(payload, args.output)
    except CheckpointError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"error: cannot write {args.output}: {error.strerror or error}", file=sys.stderr)
        return 1
    print(f"averaged {len(args.checkpoints)} checkpoints into {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
