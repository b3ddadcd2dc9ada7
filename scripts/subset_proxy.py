"""A proxy run: ``train.py`` on the first PAIRS training pairs only.

    python scripts/subset_proxy.py PAIRS [train.py overrides]

Over-fitting depends on how many times a model sees each pair. A proxy on a fifth of the
corpus reaches in a quarter of an hour, on one core, the epochs that the 60-minute preset
reaches on the whole corpus with two, so regularization can be chosen there, on the real
validation set (docs/results.md, "The hour's recipe"). The tokenizer is still trained on the
whole corpus (the cache is shared with full runs); only the training pairs are cut.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seq2seq.cli.train import main  # noqa: E402
from seq2seq.data.dataset import ParallelDataset, TokenArray  # noqa: E402
from seq2seq.training import run  # noqa: E402


def first_pairs(pairs: ParallelDataset, count: int) -> ParallelDataset:
    """The first ``count`` pairs of ``pairs``, in memory."""
    def head(side: TokenArray) -> TokenArray:
        offsets = side._offsets[: count + 1]
        return TokenArray(tokens=side._tokens[: int(offsets[-1])].copy(), offsets=offsets.copy())
    return ParallelDataset(src=head(pairs.src), tgt=head(pairs.tgt))


def cut_training_pairs(count: int) -> None:
    prepare = run.prepare

    def prepare_first_pairs(*args, **kwargs):
        prepared = prepare(*args, **kwargs)
        if prepared.train_mix is not None:
            sys.exit("subset_proxy.py: one training corpus only")
        prepared.splits["train"] = first_pairs(prepared.splits["train"], count)
        return prepared

    run.prepare = prepare_first_pairs


if __name__ == "__main__":
    if len(sys.argv) < 2 or not sys.argv[1].isdigit():
        sys.exit(__doc__.splitlines()[2].strip())
    cut_training_pairs(int(sys.argv.pop(1)))
    main()
