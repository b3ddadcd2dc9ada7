"""Where beam search's time goes, by operator (torch.profiler), for a checkpoint.

    python -m benchmarks.profile_decoding --checkpoint runs/x/checkpoints/best.pt \\
        [--beam-size 5] [--products]

Translates the first ``--sentences`` source lines of the checkpoint's test split and prints
the operators with the most self CPU time. With ``--products``, also the matrix products by
shape against the matmul ceiling of ``--precision`` measured in the same run
(:mod:`benchmarks.product_table`).
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.product_table import add_product_options, print_products
from seq2seq.checkpoint import load_checkpoint
from seq2seq.inference.decode_options import DecodeOptions
from seq2seq.inference.evaluation import read_parallel, split_files
from seq2seq.inference.runtimes import load_translator
from seq2seq.onednn_caches import bound_onednn_caches


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--sentences", type=int, default=300)
    parser.add_argument("--rows", type=int, default=12)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    add_product_options(parser)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    bound_onednn_caches(kernels=None)  # as seq2seq-translate does
    translator = load_translator(args.checkpoint, precision=args.precision)
    options = DecodeOptions(beam_size=args.beam_size)
    config = load_checkpoint(args.checkpoint)["config"]
    sources, _ = read_parallel(*split_files(config, "test"))
    sources = sources[: args.sentences]
    translator.translate(sources[:8], options, return_attention=False)  # warm-up
    shapes = args.products or args.json is not None
    with profile(activities=[ProfilerActivity.CPU], record_shapes=shapes) as profiler:
        translator.translate(sources, options, return_attention=False)
    print(f"beam {args.beam_size}, {len(sources)} sentences, {torch.get_num_threads()} threads, "
          f"precision {args.precision}")
    print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    if args.products or args.json is not None:
        print_products(profiler.key_averages(group_by_input_shape=True), translator.model,
                       args.precision, ceiling=args.ceiling, json_path=args.json)


if __name__ == "__main__":
    main()
