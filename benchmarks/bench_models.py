"""Training-step speed of encoder x decoder x scorer combinations, on synthetic batches.

Measures forward + backward + optimizer step, in target tokens per second, at a realistic
size: embeddings 256, encoder 2 x 256 (bidirectional), decoder 512, a source vocabulary of 8,000
and an output vocabulary of 4,288 pieces (Multi30k de-en with 8k joint BPE: the 4,273 pieces
its English side uses, rounded up to a multiple of 64), batches of about 2,000 target tokens
with Multi30k-like lengths (source ~14, target ~13 pieces).
It includes the Luong decoder without input feeding twice: on its parallel (fast) path and
forced through the step-by-step loop, so the gain of the fast path is measured, not assumed.

    python -m benchmarks.bench_models [--steps 20] [--warmup 3] [--threads N] [--json FILE]

Medians over ``--steps`` timed steps after ``--warmup`` untimed ones. The machine is shared
and noisy: compare rows of one run, not numbers across runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from seq2seq import CONFIG_DIR
from seq2seq.data.vocab import BOS_ID, EOS_ID, PAD_ID
from seq2seq.device import AUTOCAST_DTYPES
from seq2seq.models.build import build_model
from seq2seq.models.decoders import AttentionDecoder
from seq2seq.onednn_caches import bound_onednn_caches
from seq2seq.ops import speed_up
from seq2seq.training.loss import SequenceLoss

VOCAB = 8000
TARGET_VOCAB = 4288

COMBINATIONS = [
    # name, encoder, decoder, scorer, decoder overrides, force step-by-step
    ("gru + bahdanau + additive", "gru", "bahdanau", "additive", {}, False),
    ("gru + luong(input feeding) + additive", "gru", "luong", "additive", {}, False),
    ("gru + luong(input feeding) + dot", "gru", "luong", "dot", {}, False),
    ("gru + luong(input feeding) + general", "gru", "luong", "general", {}, False),
    ("gru + luong(input feeding) + multihead", "gru", "luong", "multihead", {}, False),
    ("lstm + luong(input feeding) + general", "lstm", "luong", "general", {}, False),
    ("gru + luong(no feeding) + additive, step loop", "gru", "luong", "additive",
     {"input_feeding": False}, True),
    ("gru + luong(no feeding) + additive, fast path", "gru", "luong", "additive",
     {"input_feeding": False}, False),
    ("gru + luong(no feeding) + general, fast path", "gru", "luong", "general",
     {"input_feeding": False}, False),
]


def model_config(encoder: str, decoder: str, scorer: str, decoder_overrides: dict):
    cfg = OmegaConf.create({
        "model": {
            "embed_dim": 256,
            "dropout": 0.2,
            "tie_embeddings": False,
            "encoder": OmegaConf.load(CONFIG_DIR / f"model/encoder/{encoder}.yaml"),
            "decoder": OmegaConf.load(CONFIG_DIR / f"model/decoder/{decoder}.yaml"),
            "attention": OmegaConf.load(CONFIG_DIR / f"model/attention/{scorer}.yaml"),
        }
    })
    cfg.model.decoder.merge_with(decoder_overrides)
    return cfg.model


def synthetic_batches(count: int, max_tokens: int, generator: torch.Generator, *,
                      target_vocab: int = TARGET_VOCAB):
    """Batches of pairs with Multi30k-like lengths, about ``max_tokens`` target tokens each."""
    batches = []
    for _ in range(count):
        tgt_len = int(torch.randint(10, 17, (1,), generator=generator))
        src_len = tgt_len + int(torch.randint(-1, 3, (1,), generator=generator))
        size = max_tokens // (tgt_len + 1)
        src_lengths = torch.randint(max(src_len - 2, 2), src_len + 1, (size,), generator=generator)
        src_lengths[0] = src_len
        src = torch.randint(4, VOCAB, (size, src_len), generator=generator)
        src[torch.arange(src_len) >= src_lengths.unsqueeze(1)] = PAD_ID
        src[torch.arange(size), src_lengths - 1] = EOS_ID
        words = torch.randint(4, target_vocab, (size, tgt_len), generator=generator)
        tgt_in = torch.cat([torch.full((size, 1), BOS_ID), words], dim=1)
        tgt_out = torch.cat([words, torch.full((size, 1), EOS_ID)], dim=1)
        batches.append((src, src_lengths, tgt_in, tgt_out))
    return batches


def bench(name, encoder, decoder, scorer, overrides, force_loop, *, steps, warmup, max_tokens,
          precision="fp32"):
    torch.manual_seed(0)
    model = speed_up(build_model(model_config(encoder, decoder, scorer, overrides),
                                 src_vocab_size=VOCAB, tgt_vocab_size=TARGET_VOCAB))  # as training
    if force_loop:  # the generic step-by-step loop, bypassing LuongDecoder's parallel path
        model.decoder.forward = AttentionDecoder.forward.__get__(model.decoder)
    objective = SequenceLoss(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = synthetic_batches(steps + warmup, max_tokens, torch.Generator().manual_seed(1))
    dtype = AUTOCAST_DTYPES[precision]
    rates = []
    for index, (src, src_lengths, tgt_in, tgt_out) in enumerate(batches):
        started = time.perf_counter()
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            loss, _ = objective(src, src_lengths, tgt_in, tgt_out)
        tokens = int((tgt_out != PAD_ID).sum())
        optimizer.zero_grad(set_to_none=True)
        (loss / tokens).backward()
        optimizer.step()
        elapsed = time.perf_counter() - started
        if index >= warmup:
            rates.append(tokens / elapsed)
    parameters = sum(p.numel() for p in model.parameters())
    return {"combination": name, "parameters": parameters,
            "tokens_per_second": statistics.median(rates)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                        help="CPU autocast dtype (as trainer.precision)")
    parser.add_argument("--only", default=None, help="run the combinations whose name contains this")
    args = parser.parse_args()
    bound_onednn_caches()  # as seq2seq-train does
    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.precision}, "
          f"batches of ~{args.max_tokens} target tokens, median of {args.steps} steps")
    print(f"{'combination':<50} {'params':>11} {'tgt tok/s':>10}")
    for combination in COMBINATIONS:
        if args.only and args.only not in combination[0]:
            continue
        result = bench(*combination, steps=args.steps, warmup=args.warmup,
                       max_tokens=args.max_tokens, precision=args.precision)
        results.append(result)
        print(f"{result['combination']:<50} {result['parameters']:>11,} "
              f"{result['tokens_per_second']:>10,.0f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
