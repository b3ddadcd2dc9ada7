"""Average the parameters of several checkpoints of one model into a new checkpoint.

    seq2seq-average runs/x/checkpoints/step*.pt --output runs/x/checkpoints/avg.pt

The checkpoints must come from the same model (parameter names and shapes, tokenizers), or
it exits with status 1 and a one-line ``error: ...`` naming the first difference. The result
loads like any other checkpoint; :mod:`seq2seq.training.averaging` says what it keeps.
``trainer.average_last=N`` does the same for the last N validations of a run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from seq2seq.checkpoint import CheckpointError, save_checkpoint
from seq2seq.config_types import error_reason
from seq2seq.training.averaging import average_checkpoints


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="seq2seq-average", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+", help="checkpoint files of one model")
    parser.add_argument("--output", required=True, help="where to write the averaged checkpoint")
    args = parser.parse_args(argv)
    try:
        payload = average_checkpoints(args.checkpoints)
        save_checkpoint(payload, args.output)
    except CheckpointError as error:
        print(f"error: {error_reason(error)}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"error: cannot write {args.output}: {error.strerror or error}", file=sys.stderr)
        return 1
    print(f"averaged {len(args.checkpoints)} checkpoints into {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
