"""Two ways to compute the same training step, timed alternately in one process.

    python scripts/ab_training.py dropout experiment=multi30k_luong_fast [--batches 30] [--rounds 4]
    python scripts/ab_training.py additive experiment=multi30k_gru_additive trainer.precision=bf16
    python scripts/ab_training.py additive experiment=multi30k_luong_fast model/attention=additive
    python scripts/ab_training.py dropout,additive,embedded experiment=multi30k_gru_additive

What each comparison runs (A against B); several, separated by commas, run one after the
other in one process, on the same model and batches, each with the code as it is around it
(what a comparison swapped is put back after it):

- ``dropout``: torch's ``F.dropout`` against ``seq2seq.models.dropout``'s int16 mask (on CPUs
  where that mask is used; README "Speed", item 9);
- ``additive``: the additive scorer's layer built at once through ``tanh`` against its chunks
  (``seq2seq.models.additive_energies``), for every query length (item 8);
- ``embedded``: the decoder's target embeddings left in float32 (autocast casts each step's RNN
  input) against cast to the autocast dtype once per batch (item 10).

The preset's model trains (forward, backward, optimizer step, under autocast when its
``trainer.precision`` says so) on ``--batches`` synthetic Multi30k-like batches of its
``batch.max_tokens``; each round runs all of them with A, then with B, the order alternating
between rounds, so a noisy machine slows both alike. Prints each side's target tokens/s per
round and their medians. The caches are bounded as ``train.py`` bounds them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from profile_training import preset_dtype, preset_training, train_step  # noqa: E402

from seq2seq.data.vocab import PAD_ID  # noqa: E402
from seq2seq.models import decoders, scorers  # noqa: E402
from seq2seq.models import dropout as dropout_module  # noqa: E402
from seq2seq.models import encoder as encoder_module  # noqa: E402
from seq2seq.models.additive_energies import additive_energies  # noqa: E402
from seq2seq.onednn_caches import bound_onednn_caches  # noqa: E402

# Kept before any swap: the comparison replaces the module's function in place.
INT16_DROPOUT = dropout_module.dropout
ADDITIVE_SCORE = scorers.AdditiveScorer.score
EMBED_ONCE = decoders.AttentionDecoder._embed


def _embed_float32(self, tokens):
    """The decoder's embeddings as before item 10: float32, cast by autocast at every step."""
    return self.dropout(self.embedding(tokens))


def _set_dropout(function) -> None:
    dropout_module.dropout = function
    encoder_module.functional_dropout = function


def _torch_dropout(x, p, training):
    return F.dropout(x, p, training)


def _additive_at_once(self, query, keys):
    q = self.query_proj(query)
    return self.v(torch.tanh(q.unsqueeze(2) + keys.unsqueeze(1))).squeeze(-1)


def _additive_chunks(self, query, keys):
    return additive_energies(self.query_proj(query), keys, self.v.weight)


COMPARISONS = {
    "dropout": (("torch", lambda: _set_dropout(_torch_dropout)),
                ("int16 mask", lambda: _set_dropout(INT16_DROPOUT))),
    "additive": (("at once", lambda: setattr(scorers.AdditiveScorer, "score", _additive_at_once)),
                 ("chunks", lambda: setattr(scorers.AdditiveScorer, "score", _additive_chunks))),
    "embedded": (("per step", lambda: setattr(decoders.AttentionDecoder, "_embed", _embed_float32)),
                 ("once", lambda: setattr(decoders.AttentionDecoder, "_embed", EMBED_ONCE))),
}


def restore_the_code() -> None:
    """Put back every function a comparison may have swapped."""
    _set_dropout(INT16_DROPOUT)
    scorers.AdditiveScorer.score = ADDITIVE_SCORE
    decoders.AttentionDecoder._embed = EMBED_ONCE


def _comparison_names(value: str) -> list[str]:
    names = value.split(",")
    unknown = [name for name in names if name not in COMPARISONS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown comparison {unknown[0]!r} (choose from {', '.join(sorted(COMPARISONS))})")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("comparisons", type=_comparison_names,
                        help=f"one or several of {','.join(sorted(COMPARISONS))}")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=...")
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    if args.batches < 1 or args.rounds < 1:
        parser.error("--batches and --rounds must be positive")
    bound_onednn_caches()
    cfg, objective, optimizer, batches = preset_training(args.overrides, args.batches)
    if "additive" in args.comparisons and not any(
            isinstance(module, scorers.AdditiveScorer) for module in objective.model.modules()):
        # Both sides would run the same code (multi30k_luong_fast scores with scaled dot).
        parser.error("the additive comparison needs a model with the additive scorer: add "
                     "model/attention=additive")
    precision, dtype = preset_dtype(cfg)

    def tokens_per_second(select) -> float:
        select()
        started, tokens = time.perf_counter(), 0
        for batch in batches:  # (src, src_lengths, tgt_in, tgt_out)
            train_step(objective, optimizer, batch, dtype)
            tokens += int((batch[3] != PAD_ID).sum())
        return tokens / (time.perf_counter() - started)

    for comparison in args.comparisons:
        sides = COMPARISONS[comparison]
        for _, select in sides:  # warm-up: kernels, allocator
            tokens_per_second(select)
        rates: dict[str, list[float]] = {name: [] for name, _ in sides}
        for round_index in range(args.rounds):
            for name, select in (sides if round_index % 2 == 0 else sides[::-1]):
                rates[name].append(tokens_per_second(select))
        restore_the_code()
        print(f"{comparison}: {' '.join(args.overrides)} ({precision}, "
              f"{args.batches} batches, {torch.get_num_threads()} threads)")
        for name, values in rates.items():
            print(f"  {name:10s} {' '.join(f'{v:,.0f}' for v in values)}  "
                  f"median {statistics.median(values):,.0f} target tokens/s")


if __name__ == "__main__":
    main()
