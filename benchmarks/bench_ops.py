"""What the speed kernels of seq2seq.ops pay: one model plain and swapped, steps alternating.

    python -m benchmarks.bench_ops experiment=multi30k_gru_additive [--mode train|greedy|beam]
        [--kernels additive_energies ...] [--steps 30] [--precision fp32|bf16]
        [--threads 1] [--clock cpu|wall] [--only plain|swapped] [--plain-loss]

Builds the preset's model (vocabularies as :mod:`benchmarks.bench_models`), copies it and swaps
``--kernels`` (all of :data:`seq2seq.ops.KERNELS` by default) into the copy, then runs the two
on the same synthetic batches of the preset's ``batch.max_tokens``, alternating which goes
first: a training step each (target tokens/s), or a greedy or beam-5 search of each batch's
sources, 30 steps (sentences/s). Medians over ``--steps`` batches after 3 untimed ones, and the
median of the per-batch ratios. ``--clock cpu`` (the default) times the process's CPU time:
on a shared machine it counts the work, not the wait for a core.

``--plain-loss`` (training) gives the plain model the loss as autograd writes it
(:func:`seq2seq.training.loss.label_smoothed_formula`) and the swapped one the blockwise kernel
training uses (:mod:`seq2seq.ops.smoothed_cross_entropy`); with ``--kernels`` and no names, that
kernel alone is measured.

``--only VARIANT`` runs that one model alone and prints its peak resident memory, to compare
across two processes (the two models of one process would share a peak).
"""

from __future__ import annotations

import argparse
import copy
import resource
import statistics
import time

import torch
from hydra import compose, initialize_config_dir

from benchmarks.bench_models import TARGET_VOCAB, VOCAB, synthetic_batches
from benchmarks.profile_training import train_step
from seq2seq import CONFIG_DIR
from seq2seq.data.vocab import PAD_ID
from seq2seq.device import AUTOCAST_DTYPES
from seq2seq.inference.search_loop import Beam, Greedy, run_search
from seq2seq.models.build import build_model
from seq2seq.onednn_caches import bound_onednn_caches
from seq2seq.ops import KERNELS, speed_up
from seq2seq.training.loss import SequenceLoss, label_smoothed_formula

WARMUP = 3
OUTPUT_LENGTH = 30  # every search runs this many steps at most, whatever the model emits


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=...")
    parser.add_argument("--mode", default="train", choices=["train", "greedy", "beam"])
    parser.add_argument("--kernels", nargs="*", default=list(KERNELS), choices=list(KERNELS))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                        help="CPU autocast dtype (as trainer.precision)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", default="cpu", choices=["cpu", "wall"])
    parser.add_argument("--only", choices=["plain", "swapped"], default=None,
                        help="run this model alone and print its peak resident memory")
    parser.add_argument("--plain-loss", action="store_true",
                        help="train the plain model with the autograd formula of the loss")
    return parser


def preset_models(overrides: list[str], kernels: list[str], only: str | None = None):
    """The preset's config, and its model (seeded) plain and swapped, with the same weights;
    only one of them with ``only``."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    torch.manual_seed(0)
    plain = build_model(cfg.model, src_vocab_size=VOCAB, tgt_vocab_size=TARGET_VOCAB)
    if only is not None:
        return cfg, {only: plain if only == "plain" else speed_up(plain, kernels)}
    return cfg, {"plain": plain, "swapped": speed_up(copy.deepcopy(plain), kernels)}


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = build_parser().parse_intermixed_args(argv)
    bound_onednn_caches()  # as seq2seq-train does
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    cfg, models = preset_models(args.overrides, args.kernels, args.only)
    dtype = AUTOCAST_DTYPES[args.precision]
    batches = synthetic_batches(args.steps + WARMUP, cfg.batch.max_tokens,
                                torch.Generator().manual_seed(1))
    names = list(models)
    loss = ", the loss kernel against its formula" if args.plain_loss else ""
    print(" ".join(args.overrides), f"({args.mode}, kernels {' '.join(args.kernels) or 'none'}{loss}, "
          f"{args.precision}, {torch.get_num_threads()} threads, {args.clock} clock)")

    if args.mode == "train":
        plain_loss = {"criterion": label_smoothed_formula} if args.plain_loss else {}
        training = {name: (SequenceLoss(models[name], label_smoothing=cfg.trainer.label_smoothing,
                                        **(plain_loss if name == "plain" else {})),
                           torch.optim.Adam(models[name].parameters(), lr=1e-3))
                    for name in names}

        def run(name: str, batch) -> int:
            train_step(*training[name], batch, dtype)
            return int((batch[3] != PAD_ID).sum())  # target tokens
    else:
        for model in models.values():
            model.eval()

        def run(name: str, batch) -> int:
            src, src_lengths = batch[0], batch[1]
            with torch.inference_mode(), torch.autocast(
                    "cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                strategy = Greedy() if args.mode == "greedy" else Beam(5)
                run_search(models[name], src, src_lengths, strategy, max_len_a=0.0,
                           max_len_b=OUTPUT_LENGTH)
            return src.size(0)  # sentences

    rates: dict[str, list[float]] = {name: [] for name in names}
    for index, batch in enumerate(batches):
        # Alternate which goes first, so that a busy moment of the machine hits both.
        for name in names if index % 2 == 0 else names[::-1]:
            started = clock()
            count = run(name, batch)
            if index >= WARMUP:
                rates[name].append(count / (clock() - started))
    unit = "target tokens/s" if args.mode == "train" else "sentences/s"
    result = {name: statistics.median(values) for name, values in rates.items()}
    for name, median in result.items():
        print(f"{name:>8}: {median:9.1f} {unit} (median of {len(rates[name])})")
    if args.only:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        print(f"peak resident memory {peak:.0f} MiB")
        result["peak_mib"] = peak
    else:
        ratios = [a / b for a, b in zip(rates["swapped"], rates["plain"], strict=True)]
        result["ratio"] = statistics.median(ratios)
        print(f"swapped/plain: {result['ratio']:.3f} (median of the per-batch ratios)")
    return result


if __name__ == "__main__":
    main()
