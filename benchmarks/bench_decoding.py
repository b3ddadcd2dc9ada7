"""Decoding speed of a checkpoint: sentences per second with greedy search and beam search.

    python -m benchmarks.bench_decoding --checkpoint runs/x/checkpoints/best.pt
    python -m benchmarks.bench_decoding --checkpoint best.pt --split valid --max-sentences 500 \\
        --device cuda --json bench/decoding.json

The sentences are the source side of a split of the checkpoint's own data config (the same
files ``seq2seq-evaluate`` scores). For each search (``--beam-sizes``, default greedy and beam 5):

- *startup*: reading the data, loading the checkpoint and building the model, plus a
  warm-up translation of a few sentences (CUDA kernels, allocator), each search on its own
  fresh model so that both pay the same startup;
- *generation*: translating all sentences (tokenize, batched search, detokenize);
- sentences/s from generation alone and from startup + generation;
- with ``--single-sentences N``: sentences/s of the first N translated one per call (the
  server's case: no batch to share the steps with).

``--checkpoint`` may name a folder written by ``seq2seq-export``: an ONNX folder runs the same
searches on ONNX Runtime, a CTranslate2 folder (``format=ctranslate2``) hands them to
CTranslate2, each through the translator ``translate.py`` builds for it
(:func:`seq2seq.inference.runtimes.load_translator`): the same tokenization, length limits and
batches. ``--count-flops`` counts PyTorch's products only: leave it out there.

Prints a table on stdout, then the results as JSON (or writes the JSON to ``--json FILE``).
BLEU is reported too, as a check that the fast settings still translate.

With ``--count-flops``, each search also translates the sentences once more, untimed, under
``torch.utils.flop_counter.FlopCounterMode`` and reports the matrix-product FLOP per sentence
(``flops_per_sentence``: the RNN cells, attention and output layer as actually run, finished
sentences already gone). The counter cannot run under autocast, so bf16/fp16 rows are counted
on the fp32 search: the same products, on translations that differ in a few sentences'
lengths only. Speed x FLOP per sentence / the matmul ceiling of the row's precision
(:mod:`benchmarks.bench`) says how close decoding is to what the CPU's matrix units allow.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path

WARMUP_SENTENCES = 8


def result_row(*, beam_size: int, sentences: int, startup: float, generation: float,
               single: float | None, bleu: float, flops_per_sentence: float | None, device: str,
               precision: str) -> dict:
    """One search setting's row of the report."""
    return {
        "search": "greedy" if beam_size == 1 else f"beam{beam_size}",
        "beam_size": beam_size,
        "sentences": sentences,
        "startup_seconds": startup,
        "generation_seconds": generation,
        "sentences_per_second": sentences / max(generation, 1e-9),
        "sentences_per_second_with_startup": sentences / max(startup + generation, 1e-9),
        "single_sentences_per_second": single,
        "bleu": bleu,
        "flops_per_sentence": flops_per_sentence,
        "device": device,
        "precision": precision,
    }


def bench_one(
    *,
    checkpoint: Path,
    sources: list[str],
    references: list[str],
    data_seconds: float,
    beam_size: int,
    device: str,
    max_tokens: int,
    precision: str = "fp32",
    count_flops: bool = False,
    single_sentences: int = 0,
) -> dict:
    """Time one search setting on a freshly loaded model (and count its FLOP, untimed)."""
    from seq2seq.inference.decode_options import DecodeOptions
    from seq2seq.inference.evaluation import evaluate_translations
    from seq2seq.inference.runtimes import load_translator

    options = DecodeOptions(beam_size=beam_size)
    started = time.perf_counter()
    translator = load_translator(checkpoint, device, max_tokens=max_tokens, precision=precision)
    translator.translate(sources[:WARMUP_SENTENCES], options, return_attention=False)
    startup = time.perf_counter() - started + data_seconds

    evaluation = evaluate_translations(translator, sources, references, options)
    generation = evaluation.generation_seconds
    single = None
    if single_sentences:
        # The server's case: one sentence per call, no batch to share the steps with.
        started = time.perf_counter()
        for sentence in sources[:single_sentences]:
            translator.translate([sentence], options, return_attention=False)
        single = min(single_sentences, len(sources)) / (time.perf_counter() - started)
    flops_per_sentence = None
    if count_flops:
        from torch.utils.flop_counter import FlopCounterMode

        # The counter cannot run under autocast (it decomposes the GRU into products of mixed
        # dtypes), so every row is counted on the fp32 search.
        counted = load_translator(checkpoint, device, max_tokens=max_tokens)
        with FlopCounterMode(display=False) as counter:
            counted.translate(sources, options, return_attention=False)
        flops_per_sentence = counter.get_total_flops() / max(len(sources), 1)
    return result_row(beam_size=beam_size, sentences=len(sources), startup=startup,
                      generation=generation, single=single, bleu=evaluation.scores["bleu"],
                      flops_per_sentence=flops_per_sentence, device=str(translator.device),
                      precision=precision)


def format_table(results: Sequence[dict]) -> str:
    lines = [
        f"{'search':<8} {'sentences':>9} {'startup s':>9} {'generation s':>12} "
        f"{'sent/s':>8} {'sent/s total':>12} {'BLEU':>6} {'MFLOP/sent':>10} {'1 by 1/s':>9}"
    ]
    for r in results:
        flops = r.get("flops_per_sentence")
        lines.append(
            f"{r['search']:<8} {r['sentences']:>9d} {r['startup_seconds']:>9.2f} "
            f"{r['generation_seconds']:>12.2f} {r['sentences_per_second']:>8.1f} "
            f"{r['sentences_per_second_with_startup']:>12.1f} {r['bleu']:>6.2f} "
            + (f"{flops / 1e6:>10.1f}" if flops is not None else f"{'-':>10}")
            + (f" {r['single_sentences_per_second']:>9.1f}"
               if r.get("single_sentences_per_second") else f" {'-':>9}")
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True,
                        help="a checkpoint file, or a folder written by seq2seq-export")
    parser.add_argument("--split", default="test", choices=["valid", "test"])
    parser.add_argument("--max-sentences", type=int, default=None, help="use the first N only")
    parser.add_argument("--beam-sizes", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps")
    parser.add_argument("--max-tokens", type=int, default=4000, help="padded source ids per batch")
    parser.add_argument("--num-threads", type=int, default=None, help="CPU threads for torch")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                        help="autocast dtype of the search")
    parser.add_argument("--count-flops", action="store_true",
                        help="also count matrix-product FLOP per sentence (one more, untimed pass)")
    parser.add_argument("--single-sentences", type=int, default=0,
                        help="also translate the first N sentences one per call (the server's "
                             "case) and report their sentences/s")
    parser.add_argument("--json", default=None, help="write the JSON here instead of stdout")
    args = parser.parse_args(argv)

    import torch

    from seq2seq.onednn_caches import bound_onednn_caches

    bound_onednn_caches(kernels=None)  # as seq2seq-translate and seq2seq-evaluate do
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    from seq2seq.checkpoint import CheckpointError
    from seq2seq.data.text_files import DataError
    from seq2seq.inference.evaluation import read_parallel, split_files
    from seq2seq.inference.model_files import load_model_payload

    try:
        data_started = time.perf_counter()
        config = load_model_payload(args.checkpoint)["config"]
        src_path, ref_path = split_files(config, args.split)
        sources, references = read_parallel(src_path, ref_path)
        if args.max_sentences is not None:
            sources, references = sources[: args.max_sentences], references[: args.max_sentences]
        data_seconds = time.perf_counter() - data_started
        results = [
            bench_one(
                checkpoint=Path(args.checkpoint),
                sources=sources,
                references=references,
                data_seconds=data_seconds,
                beam_size=beam_size,
                device=args.device,
                max_tokens=args.max_tokens,
                precision=args.precision,
                count_flops=args.count_flops,
                single_sentences=args.single_sentences,
            )
            for beam_size in args.beam_sizes
        ]
    except (CheckpointError, DataError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1

    report = {
        "checkpoint": args.checkpoint,
        "split": args.split,
        "src": str(src_path),
        "max_tokens": args.max_tokens,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "results": results,
    }
    print(format_table(results), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}", file=sys.stderr)
    else:
        print(json.dumps(report, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
