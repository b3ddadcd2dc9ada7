"""``make bench``: training and decoding speed of the Multi30k presets, as a table and JSON.

Training, for ``multi30k_gru_additive`` (the like-for-like preset) and ``multi30k_luong_fast``:
``train.py`` runs as a child process for ``--train-steps`` steps on Multi30k de-en, logging
target tokens per second (non-padding tokens) every 25 steps; the median of the windows after
the first (warm-up) is the steady-state speed. Peak resident memory is the child's
``ru_maxrss``, as ``/usr/bin/time -v`` reports it.

Decoding: greedy and beam-5 sentences per second over the 1,000 sentences of test_2016, with a
trained checkpoint (``--checkpoint``, default: the like-for-like preset's ``best.pt`` from
``runs/``), generation only and with start-up (``scripts/bench_decoding.py``).

    SEQ2SEQ_MULTI30K_URL=../shared/data/multi30k make bench
    python scripts/bench.py --train-steps 300 --checkpoint runs/x/checkpoints/best.pt --json bench/results.json

Runs in about 5 minutes on 2 CPU cores. The machine may be shared and noisy: compare numbers
of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (preset, extra overrides): the two presets as they are, and the like-for-like one in bf16.
TRAINING_RUNS = (
    ("multi30k_gru_additive", ()),
    ("multi30k_gru_additive", ("trainer.precision=bf16",)),
    ("multi30k_luong_fast", ()),
)
SPEED_LINE = re.compile(r"step (\d+) epoch \d+: loss \S+ lr \S+ grad norm \S+ (\d+) tok/s")


# Runs a command and reports the peak resident memory of its process tree (like time -v).
PEAK_MEMORY_WRAPPER = (
    "import resource, subprocess, sys\n"
    "code = subprocess.run(sys.argv[1:]).returncode\n"
    "print('PEAK_RSS_KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.exit(code)\n"
)


def bench_training(preset: str, extra: tuple[str, ...], steps: int, log_every: int = 25) -> dict:
    with tempfile.TemporaryDirectory() as run_dir:
        command = [
            sys.executable, "-c", PEAK_MEMORY_WRAPPER, sys.executable, str(ROOT / "train.py"), f"experiment={preset}",
            f"hydra.run.dir={run_dir}", f"trainer.max_steps={steps}", "trainer.max_time=null",
            f"trainer.log_every={log_every}", "trainer.valid_every=null",
            "trainer.save_every=null", "trainer.valid.max_sentences=16",
            "trainer.progress_bar=false", *extra,
        ]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"training {preset} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    rates = [int(rate) for _, rate in SPEED_LINE.findall(result.stdout + result.stderr)]
    steady = rates[1:] or rates
    peak_kib = int(re.search(r"PEAK_RSS_KIB (\d+)", result.stdout).group(1))
    return {
        "preset": preset,
        "overrides": list(extra),
        "precision": re.search(r"precision=(\w+)", " ".join(extra)).group(1) if extra else None,
        "steps": steps,
        "tokens_per_second_median": statistics.median(steady),
        "tokens_per_second_windows": rates,
        "peak_rss_gib": peak_kib / 2**20,
    }


def bench_decoding(checkpoint: Path, max_sentences: int | None, precision: str) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / "decoding.json"
        command = [sys.executable, str(ROOT / "scripts" / "bench_decoding.py"),
                   "--checkpoint", str(checkpoint), "--split", "test", "--json", str(output),
                   "--precision", precision]
        if max_sentences:
            command += ["--max-sentences", str(max_sentences)]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"decoding benchmark failed:\n{result.stderr[-3000:]}")
        return json.loads(output.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-steps", type=int, default=150)
    parser.add_argument("--checkpoint", type=Path,
                        default=ROOT / "runs/multi30k_gru_additive/checkpoints/best.pt")
    parser.add_argument("--max-sentences", type=int, default=None)
    parser.add_argument("--decode-precisions", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results.json")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")

    results: dict = {"training": [], "decoding": None}
    print(f"{'training preset':<52} {'tgt tok/s (median)':>19} {'peak RSS':>10}")
    for preset, extra in TRAINING_RUNS:
        row = bench_training(preset, extra, args.train_steps)
        results["training"].append(row)
        name = " ".join((preset, *extra))
        print(f"{name:<52} {row['tokens_per_second_median']:>19,.0f} "
              f"{row['peak_rss_gib']:>8.2f} GiB", flush=True)
    if args.checkpoint.is_file():
        results["decoding"] = []
        print(f"\ndecoding {args.checkpoint}, test_2016 ({args.max_sentences or 'all'} sentences)")
        print(f"{'search':<8} {'precision':<9} {'sent/s':>8} {'sent/s with start-up':>21} {'BLEU':>6}")
        for precision in args.decode_precisions:
            for row in bench_decoding(args.checkpoint, args.max_sentences, precision)["results"]:
                results["decoding"].append(row)
                print(f"{row['search']:<8} {precision:<9} {row['sentences_per_second']:>8.1f} "
                      f"{row['sentences_per_second_with_startup']:>21.1f} {row['bleu']:>6.2f}",
                      flush=True)
    else:
        print(f"\nno checkpoint at {args.checkpoint}: decoding skipped "
              "(train one with `python train.py experiment=multi30k_gru_additive "
              "hydra.run.dir=runs/multi30k_gru_additive`)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    print(f"\nwritten to {args.json}")


if __name__ == "__main__":
    main()
