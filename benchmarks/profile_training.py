"""Where a training step's time goes, by operator, for an experiment preset (torch.profiler).

    python -m benchmarks.profile_training experiment=multi30k_gru_additive [--steps 5] \\
        [--by-shape] [--products] [--plain]

Builds the preset's model (source vocabulary 8,000, output vocabulary 4,288 as on Multi30k
de-en; ``--target-vocab N`` another, e.g. 4,273 to see what an unaligned output layer costs)
with the speed kernels training swaps in (:func:`seq2seq.ops.speed_up`; ``--plain``: the
model as :mod:`seq2seq.models` writes it, to see what the kernels pay), runs forward + backward
+ optimizer step on synthetic Multi30k-like batches of the preset's ``batch.max_tokens`` (under
autocast when the preset's ``trainer.precision`` says so), and prints the operators with the
most self CPU time (with ``--by-shape``, one row per operator and input shapes, e.g. to tell
the output layer's products from the GRU's). With ``--products``, also the matrix products by
shape against the matmul ceiling of the preset's precision measured in the same run
(:mod:`benchmarks.product_table`): whether the products run slowly or the time goes elsewhere.
"""

from __future__ import annotations

import argparse

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from torch.profiler import ProfilerActivity, profile

from benchmarks.bench_models import TARGET_VOCAB, VOCAB, synthetic_batches
from benchmarks.product_table import add_product_options, print_products
from seq2seq import CONFIG_DIR
from seq2seq.device import AUTOCAST_DTYPES, decide_precision
from seq2seq.models.build import build_model
from seq2seq.onednn_caches import bound_onednn_caches
from seq2seq.ops import speed_up
from seq2seq.training.loss import SequenceLoss
from seq2seq.training.step_timing import BATCHES, training_workload


def preset_training(overrides: list[str], batch_count: int, *, plain: bool = False,
                    target_vocab: int = TARGET_VOCAB):
    """The preset's composed config, its model's loss (seeded), optimizer and synthetic batches
    of its ``batch.max_tokens``; the model with training's speed kernels unless ``plain``."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    torch.manual_seed(0)
    model = build_model(cfg.model, src_vocab_size=VOCAB, tgt_vocab_size=target_vocab)
    if not plain:
        speed_up(model)
    objective = SequenceLoss(model, label_smoothing=cfg.trainer.label_smoothing)
    optimizer = instantiate(cfg.optimizer)(model.parameters())
    batches = synthetic_batches(batch_count, cfg.batch.max_tokens, torch.Generator().manual_seed(1),
                                target_vocab=target_vocab)
    return cfg, objective, optimizer, batches


def preset_precision(cfg, objective, optimizer, batches) -> tuple[str, str]:
    """The preset's precision on this CPU and why: ``auto`` decided as training decides it, by
    timing the preset's own step (on ``batches``; or read from the cache a run filled)."""
    cpu = torch.device("cpu")
    workload = training_workload(objective, optimizer, lambda: batches[:BATCHES], device=cpu,
                                 max_tokens=cfg.batch.max_tokens)
    return decide_precision(cfg.trainer.precision, cpu, workload=workload)


def train_step(objective, optimizer, batch, dtype: torch.dtype | None) -> None:
    """One forward, backward and optimizer step on ``batch``, under autocast to ``dtype``
    (None: float32)."""
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        loss, _ = objective(*batch)
    optimizer.zero_grad(set_to_none=True)
    (loss / 1000).backward()
    optimizer.step()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=...")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=12)
    parser.add_argument("--by-shape", action="store_true", help="group by operator and input shapes")
    parser.add_argument("--plain", action="store_true",
                        help="without the speed kernels of seq2seq.ops (what they pay)")
    parser.add_argument("--target-vocab", type=int, default=TARGET_VOCAB,
                        help=f"the output layer's rows (default {TARGET_VOCAB}, as on Multi30k)")
    add_product_options(parser)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    bound_onednn_caches()  # as seq2seq-train does
    cfg, objective, optimizer, batches = preset_training(args.overrides, args.steps + 2,
                                                         plain=args.plain,
                                                         target_vocab=args.target_vocab)

    precision = preset_precision(cfg, objective, optimizer, batches)[0]
    dtype = AUTOCAST_DTYPES[precision]

    for batch in batches[:2]:  # warm-up
        train_step(objective, optimizer, batch, dtype)
    shapes = args.by_shape or args.products or args.json is not None
    with profile(activities=[ProfilerActivity.CPU], record_shapes=shapes) as profiler:
        for batch in batches[2:]:
            train_step(objective, optimizer, batch, dtype)
    print(" ".join(args.overrides), f"({args.steps} steps, {torch.get_num_threads()} threads, "
          f"{precision}{', plain' if args.plain else ''})")
    table = profiler.key_averages(group_by_input_shape=args.by_shape).table(
        sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=40,
        max_shapes_column_width=60,
    )
    print(table)
    if args.products or args.json is not None:
        print_products(profiler.key_averages(group_by_input_shape=True), objective.model,
                       precision, ceiling=args.ceiling, json_path=args.json)


if __name__ == "__main__":
    main()
