"""What a regularizer costs a ``multi30k_transformer`` training step (docs/results.md quotes it).

    python -m benchmarks.bench_regularizers [--rounds 3] [--steps 10] [--threads 2]

Each variant is the preset with overrides, built with training's speed kernels, and steps over
the same synthetic Multi30k-like batches of its ``batch.max_tokens`` in float32
(:func:`benchmarks.profile_training.preset_training`); ``ema`` adds the weights' average
(:class:`seq2seq.training.ema.WeightAverage`) after each step. The variants alternate, round by
round, so a slower minute of the machine falls on all of them; it prints milliseconds a step
per round and each variant's median against the preset's, then the average's update alone.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.profile_training import preset_training, train_step
from seq2seq.training.ema import WeightAverage

PRESET = ["experiment=multi30k_transformer"]
VARIANTS = {  # name: (overrides, with the weights' average)
    "preset (dropout 0.2)": ([], False),
    "dropout 0.3": (["model.dropout=0.3"], False),
    "dropout 0.3, attention dropout 0.1": (
        ["model.dropout=0.3", "model.encoder.attention_dropout=0.1",
         "model.decoder.attention_dropout=0.1"], False),
    "dropout 0.3, trainer.ema=0.999": (["model.dropout=0.3"], True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="timed steps a round")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    built = {}
    for name, (overrides, ema) in VARIANTS.items():
        _, objective, optimizer, batches = preset_training(PRESET + overrides, args.steps + 2)
        average = WeightAverage(objective.model, 0.999) if ema else None
        built[name] = objective.train(), optimizer, batches, average
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name, (objective, optimizer, batches, average) in built.items():
            for batch in batches[:2]:  # warm-up
                train_step(objective, optimizer, batch, None)
            started = time.perf_counter()
            for batch in batches[2:]:
                train_step(objective, optimizer, batch, None)
                if average is not None:
                    average.update(objective.model)
            times[name].append((time.perf_counter() - started) / args.steps * 1000)
    base = statistics.median(times[next(iter(VARIANTS))])
    for name, rounds in times.items():
        print(f"{name}: {' '.join(f'{t:.0f}' for t in rounds)} ms a step; median "
              f"{statistics.median(rounds) / base:.2f}x the preset's ({args.threads} threads, "
              "fp32)")
    objective, _, _, average = built["dropout 0.3, trainer.ema=0.999"]
    started = time.perf_counter()
    for _ in range(100):
        average.update(objective.model)
    update = (time.perf_counter() - started) * 10  # ms: 100 updates
    print(f"the average's update alone: {update:.1f} ms ({100 * update / base:.1f} % of the "
          f"preset's step; {sum(p.numel() for p in objective.model.parameters()):,} parameters)")


if __name__ == "__main__":
    main()
