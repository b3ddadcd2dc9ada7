"""The encoder's two ways to skip padding, timed against each other on the same batches.

    python scripts/bench_encoder.py [--batches 160] [--precision fp32|bf16] [--hidden-size 256]

Forward + backward of the like-for-like encoder (embeddings 256, bidirectional GRU 2 x 256,
dropout 0.2; ``--hidden-size`` sets both widths) over Multi30k-like batches (source lengths
10-21 with up to 4 pieces less in the rest of the batch, about 1,200 padded tokens): packed
sequences (``RNNEncoder._run_packed``, what CUDA runs) and one RNN call per direction over the
padded batch (``_run_padded``, what the CPU runs). The two run alternately on every batch, in
alternating order, so a noisy machine slows both alike; the first 10 batches are warm-up.
Prints the mean and median milliseconds of each.
The oneDNN kernel cache is bounded as ``train.py`` bounds it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WARMUP = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=160)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--hidden-size", type=int, default=256,
                        help="embedding and GRU width (256: the like-for-like encoder)")
    args = parser.parse_args()
    if args.batches <= WARMUP:
        parser.error(f"--batches must be more than the {WARMUP} warm-up batches")
    if args.hidden_size < 1:
        parser.error(f"--hidden-size must be positive, got {args.hidden_size}")
    import torch  # after the arguments: a bad one is refused without torch's import

    from seq2seq.models.encoder import RNNEncoder
    from seq2seq.onednn_caches import bound_onednn_caches

    bound_onednn_caches()
    torch.manual_seed(0)
    encoder = RNNEncoder(vocab_size=8000, embed_dim=args.hidden_size,
                         hidden_size=args.hidden_size, bidirectional=True, dropout=0.2).train()
    generator = torch.Generator().manual_seed(0)
    times: dict[str, list[float]] = {"packed": [], "padded": []}
    for index in range(args.batches):
        longest = int(torch.randint(10, 22, (1,), generator=generator))
        rows = 1200 // (longest + 1)
        lengths = torch.randint(max(longest - 4, 1), longest + 1, (rows,), generator=generator)
        lengths[0] = longest
        src = torch.randint(4, 8000, (rows, longest), generator=generator)
        mask = torch.arange(longest) < lengths.unsqueeze(1)
        for path in (("packed", "padded") if index % 2 else ("padded", "packed")):
            started = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
                embedded = encoder.embedding(src)
                if path == "packed":
                    memory, final = encoder._run_packed(embedded, lengths)
                else:
                    memory, final = encoder._run_padded(embedded, lengths, mask)
            (memory.float().sum() + final.float().sum()).backward()
            if index >= WARMUP:
                times[path].append(time.perf_counter() - started)
    print(f"encoder forward + backward, {args.precision}, {args.batches - WARMUP} batches, "
          f"{torch.get_num_threads()} threads, width {args.hidden_size}")
    for path, values in times.items():
        print(f"  {path:7s} mean {1e3 * statistics.mean(values):6.1f} ms   "
              f"median {1e3 * statistics.median(values):6.1f} ms")


if __name__ == "__main__":
    main()
