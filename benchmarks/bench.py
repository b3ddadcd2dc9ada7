"""``make bench``: training and decoding speed of the Multi30k presets, as a table and JSON.

    SEQ2SEQ_MULTI30K_URL=../shared/data/multi30k make bench
    python -m benchmarks.bench --train-steps 300 --checkpoint runs/x/checkpoints/best.pt \\
        --json bench/results.json

The machine first: the CPU model, whether it has bf16 matrix instructions, and the **matmul
ceiling** measured in the same run (the best of a few 4096^3 ``torch.mm`` in fp32 and bf16, in
GFLOP/s). Where a 512^3 bf16 product runs at less than half the fp32 speed, bf16 is emulated:
its ceiling, training rows and decoding rows are skipped, and the line says so. Each speed is
also a percentage of its precision's ceiling, from the matrix-product FLOP of the work
(``torch.utils.flop_counter``; element-wise work is not counted, so 100% is out of reach).

Training: ``multi30k_gru_additive`` (the like-for-like preset), ``multi30k_luong_fast`` and
``multi30k_transformer``, each in fp32 and bf16, run ``train.py`` in a child process for
``--train-steps`` steps; the median of the target tokens/s windows after the first is the
steady-state speed; then the ratios bf16 / fp32, fast / like-for-like and Transformer /
like-for-like. Peak resident memory is the child's ``ru_maxrss``; one more run
of ``--memory-steps`` steps of ``multi30k_luong_fast`` gives the peak of a longer run.

Decoding: greedy and beam-5 sentences/s and BLEU on test_2016 in each of
``--decode-variants`` (fp32, bf16 autocast), with a trained checkpoint (``--checkpoint``),
through :mod:`benchmarks.bench_decoding`; then the checkpoint exported (``seq2seq-export``, fp32
and int8) and the same searches on ONNX Runtime, with the export's time and folder size. The
same again for a Transformer (``--transformer-checkpoint``), plus CTranslate2 (``seq2seq-export
format=ctranslate2``, fp32 and int8). Each row also translates 100 sentences one per call (the
server's case, "1 by 1/s").

Where the time goes (``--profile-steps 0`` skips it): each training row and each decoding
variant profiled briefly (:mod:`benchmarks.profile_training`, :mod:`benchmarks.profile_decoding`),
and a line with the share of the operators' time spent in matrix products and their speed
against the ceiling: on a new CPU, whether the products run slowly or the time goes elsewhere.

The machine may be shared and noisy: compare numbers of one run.
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
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
# (preset, precision): both presets in both precisions, so that each precision has its fast /
# like-for-like ratio. bf16 rows run only where bf16 is native.
TRAINING_RUNS = (
    ("multi30k_gru_additive", "fp32"),
    ("multi30k_gru_additive", "bf16"),
    ("multi30k_luong_fast", "fp32"),
    ("multi30k_luong_fast", "bf16"),
    ("multi30k_transformer", "fp32"),
    ("multi30k_transformer", "bf16"),
)
# A CPU whose bf16 products run at less than this share of its fp32 speed emulates them: bf16
# rows would take hours there and show nothing, so they are skipped. An AVX-512 CPU without
# AVX512-BF16 has oneDNN bf16 kernels and is timed as usual.
NATIVE_BF16_SHARE = 0.5
SPEED_LINE = re.compile(r"step (\d+) epoch \d+: loss \S+ lr \S+ grad norm \S+ (\d+) tok/s")


# Runs a command and reports the peak resident memory of its process tree (like time -v).
PEAK_MEMORY_WRAPPER = (
    "import resource, subprocess, sys\n"
    "code = subprocess.run(sys.argv[1:]).returncode\n"
    "print('PEAK_RSS_KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.exit(code)\n"
)


def cpu_model() -> str:
    """The CPU's model name and its bf16 matrix extensions, from /proc/cpuinfo."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        import platform

        return platform.processor() or "unknown CPU"
    name = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    flags = set((re.search(r"^flags\s*:\s*(.+)$", info, re.M) or ["", ""])[1].split())
    extensions = [flag for flag in ("avx512_bf16", "amx_bf16") if flag in flags]
    return f"{name.group(1).strip() if name else 'unknown CPU'} " \
           f"({', '.join(extensions) or 'no bf16 matrix instructions'})"


def best_rate(product, operations: float, repeats: int) -> float:
    """G operations per second of the fastest of ``repeats`` calls of ``product`` (after one
    warm-up call)."""
    product()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        product()
        best = min(best, time.perf_counter() - started)
    return operations / best / 1e9


def matmul_ceiling(dtype: torch.dtype, size: int = 4096, repeats: int = 3) -> float:
    """GFLOP/s of the best of ``repeats`` size^3 matrix products (after one warm-up)."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    return best_rate(lambda: torch.mm(a, b), 2 * size**3, repeats)


def matmul_ceilings() -> tuple[dict[str, float], str]:
    """The fp32 ceiling, the bf16 one where bf16 is native, and a line saying what was found.

    bf16 is native when a 512^3 bf16 product runs at least ``NATIVE_BF16_SHARE`` of the fp32
    speed (best of three each: under 2 s even where emulated); without that the bf16 ceiling
    is not measured (4096^3 would take minutes) and bf16 rows are skipped.
    """
    share = matmul_ceiling(torch.bfloat16, 512) / matmul_ceiling(torch.float32, 512)
    ceilings = {"fp32": matmul_ceiling(torch.float32)}
    if share >= NATIVE_BF16_SHARE:
        ceilings["bf16"] = matmul_ceiling(torch.bfloat16)
        bf16 = f"bf16 {ceilings['bf16']:.0f} GFLOP/s ({ceilings['bf16'] / ceilings['fp32']:.2f}x)"
    else:
        bf16 = f"bf16 emulated ({100 * share:.1f}% of fp32 speed on 512^3): bf16 rows skipped"
    line = f"matmul ceiling (4096^3 torch.mm): fp32 {ceilings['fp32']:.0f} GFLOP/s, {bf16}"
    return ceilings, line


def runs_for(ceilings: dict[str, float], decode_variants: list[str]) -> dict:
    """What this CPU runs: the training rows, the memory run's precision and the decoding
    variants, leaving out bf16 where it has no bf16 ceiling (emulated, see above)."""
    native_bf16 = "bf16" in ceilings
    return {
        "training": [(preset, precision) for preset, precision in TRAINING_RUNS
                     if precision in ceilings],
        "memory_precision": "bf16" if native_bf16 else "fp32",
        "decoding": [v for v in decode_variants if v != "bf16" or native_bf16],
    }


def skip_reason(variant: str) -> str:
    """Why ``runs_for`` left a decoding variant out."""
    return f"{variant} products are emulated on this CPU"


def flops_per_target_token(preset: str, batch: int = 64, length: int = 14) -> float:
    """Matrix-product FLOP per target token of one training step of ``preset`` (see above)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from torch.utils.flop_counter import FlopCounterMode

    from benchmarks.bench_models import TARGET_VOCAB
    from seq2seq import CONFIG_DIR
    from seq2seq.models.build import build_model

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[f"experiment={preset}"])
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    src_vocab, tgt_vocab = cfg.tokenizer.vocab_size, TARGET_VOCAB  # Multi30k's output rows
    model = build_model(model_cfg, src_vocab_size=src_vocab, tgt_vocab_size=tgt_vocab).train()
    src = torch.randint(4, src_vocab, (batch, length))
    tgt_in = torch.randint(4, tgt_vocab, (batch, length))
    lengths = torch.full((batch,), length)
    with FlopCounterMode(display=False) as counter:
        features, _ = model(src, lengths, tgt_in)
        logits = model.project(features)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt_in.flatten()).backward()
    return counter.get_total_flops() / (batch * length)


def bench_training(preset: str, precision: str, steps: int, log_every: int = 25) -> dict:
    with tempfile.TemporaryDirectory() as run_dir:
        command = [
            sys.executable, "-c", PEAK_MEMORY_WRAPPER, sys.executable, str(ROOT / "train.py"), f"experiment={preset}",
            f"hydra.run.dir={run_dir}", f"trainer.max_steps={steps}", "trainer.max_time=null",
            f"trainer.log_every={log_every}", "trainer.valid_every=null",
            "trainer.save_every=null", "trainer.valid.max_sentences=16",
            "trainer.progress_bar=false", f"trainer.precision={precision}",
        ]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"training {preset} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    rates = [int(rate) for _, rate in SPEED_LINE.findall(result.stdout + result.stderr)]
    steady = rates[1:] or rates
    peak_kib = int(re.search(r"PEAK_RSS_KIB (\d+)", result.stdout).group(1))
    return {
        "preset": preset,
        "precision": precision,
        "steps": steps,
        "tokens_per_second_median": statistics.median(steady),
        "tokens_per_second_windows": rates,
        "peak_rss_gib": peak_kib / 2**20,
    }


def training_ratios(rows: list[dict]) -> dict[str, float]:
    """The training ratios from the rows of one run: bf16 over fp32 for the
    like-for-like preset, and the fast preset over the like-for-like one in each precision."""
    speed = {(row["preset"], row["precision"]): row["tokens_per_second_median"] for row in rows}
    ratios = {}
    like, fast = "multi30k_gru_additive", "multi30k_luong_fast"
    transformer = "multi30k_transformer"
    for preset in (like, transformer):
        if (preset, "bf16") in speed and (preset, "fp32") in speed:
            ratios[f"{preset} bf16/fp32"] = speed[preset, "bf16"] / speed[preset, "fp32"]
    for precision in ("fp32", "bf16"):
        if (fast, precision) in speed and (like, precision) in speed:
            ratios[f"fast/like-for-like {precision}"] = (
                speed[fast, precision] / speed[like, precision])
        if (transformer, precision) in speed and (like, precision) in speed:
            ratios[f"transformer/like-for-like {precision}"] = (
                speed[transformer, precision] / speed[like, precision])
    return ratios


def auto_precision_shares(rows: list[dict], chosen: dict[str, str]) -> dict[str, float]:
    """For each preset with an fp32 row: the speed of the precision ``auto`` chose for it
    (``chosen``, by preset) as a share of the faster of its fp32 and bf16 rows (1.0: auto chose
    the faster). A preset without a bf16 row ran where bf16 is emulated (far slower: fp32 is
    the faster); auto's bf16 there has no row to go by, and counts 0."""
    speed = {(row["preset"], row["precision"]): row["tokens_per_second_median"] for row in rows}
    shares = {}
    for preset in dict.fromkeys(row["preset"] for row in rows):
        fp32, bf16 = speed.get((preset, "fp32")), speed.get((preset, "bf16"))
        if fp32 is None or preset not in chosen:
            continue
        if bf16 is None:
            shares[preset] = 1.0 if chosen[preset] == "fp32" else 0.0
        else:
            shares[preset] = (bf16 if chosen[preset] == "bf16" else fp32) / max(fp32, bf16)
    return shares


def auto_precision_line(preset: str, chosen: str, reason: str, share: float | None) -> str:
    """``PRESET: precision=auto -> fp32 (why); 100% of the faster precision's speed``"""
    against = "" if share is None else (f"; {100 * share:.0f}% of the training speed of the "
                                        "faster of fp32 and bf16 above")
    return f"{preset}: precision=auto -> {chosen} ({reason}){against}"


def auto_choices(presets: list[str]) -> dict[str, tuple[str, str]]:
    """What ``trainer.precision=auto`` picks for each preset's training step on this CPU, and
    why: its workload timed on the preset's model and synthetic batches (or read from the
    cache, where a run or an earlier bench timed it)."""
    from benchmarks.profile_training import preset_precision, preset_training
    from seq2seq.training.step_timing import BATCHES

    choices = {}
    for preset in presets:
        cfg, *training = preset_training([f"experiment={preset}", "trainer.precision=auto"],
                                         BATCHES)
        choices[preset] = preset_precision(cfg, *training)
    return choices


def bench_decoding(checkpoint: Path, max_sentences: int | None, precision: str, *,
                   count_flops: bool = True) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / "decoding.json"
        command = [sys.executable, "-m", "benchmarks.bench_decoding",
                   "--checkpoint", str(checkpoint), "--split", "test", "--json", str(output),
                   "--precision", precision, "--single-sentences", str(SINGLE_SENTENCES)]
        if count_flops:
            command.append("--count-flops")
        if max_sentences:
            command += ["--max-sentences", str(max_sentences)]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"decoding benchmark failed:\n{result.stderr[-3000:]}")
        return json.loads(output.read_text())


# Sentences of test_2016 each decoding row also translates one per call (the server's case).
SINGLE_SENTENCES = 100
# The exported rows: seq2seq-export's quantize option of each.
EXPORTS = ("none", "int8")


def export_for_bench(checkpoint: Path, folder: Path, quantize: str, *,
                     output_format: str = "onnx") -> dict:
    """Export ``checkpoint`` to ``folder``; the export's seconds and the folder's size."""
    started = time.perf_counter()
    from seq2seq.export import export_checkpoint

    export_checkpoint(checkpoint, folder, format=output_format, quantize=quantize, overwrite=True)
    seconds = time.perf_counter() - started
    size = sum(path.stat().st_size for path in folder.iterdir())
    return {"checkpoint": str(checkpoint), "format": output_format, "quantize": quantize,
            "export_seconds": seconds, "folder_mb": size / 1e6}


# Sentences of test_2016 each decoding profile of "where the time goes" translates.
PROFILE_SENTENCES = 300


def profile_products(module: str, module_args: list[str], ceiling: float) -> dict:
    """Run ``python -m benchmarks.<module> ... --json`` (``profile_training`` or
    ``profile_decoding``) against ``ceiling`` and return its products' summary
    (:mod:`benchmarks.product_table`)."""
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / "products.json"
        command = [sys.executable, "-m", f"benchmarks.{module}", *module_args, "--rows", "1",
                   "--ceiling", str(ceiling), "--json", str(output)]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"{module} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
        return json.loads(output.read_text())


def products_line(name: str, summary: dict) -> str:
    """One row of the "where the time goes" section."""
    share = summary["product_percent_of_ceiling"]
    speed = f"{share:.0f}% of the ceiling" if share is not None else "-"
    return (f"{name:<52} {100 * summary['product_share']:>9.0f}% {speed:>20} "
            f"{100 * (1 - summary['product_share']):>14.0f}%")


def print_profiles(runs: dict, ceilings: dict[str, float], args, results: dict) -> None:
    """The "where the time goes" section: each training row and each decoding variant with a
    ceiling (fp32, bf16 where native) profiled briefly, the share of the operators' time in
    matrix products and their speed."""
    print(f"\nwhere the time goes (torch.profiler, benchmarks.profile_training and "
          f"profile_decoding --products: {args.profile_steps} steps / {PROFILE_SENTENCES} "
          f"sentences; share of the operators' time)")
    print(f"{'run':<52} {'products':>10} {'their speed':>20} {'everything else':>15}")
    results["profiles"] = []
    for preset, precision in runs["training"]:
        summary = profile_products(
            "profile_training", [f"experiment={preset}", f"trainer.precision={precision}",
                                 "--steps", str(args.profile_steps)], ceilings[precision])
        results["profiles"].append({"training": preset, "precision": precision, **summary})
        print(products_line(f"training {preset} {precision}", summary), flush=True)
    if not args.checkpoint.is_file():
        return
    for variant in runs["decoding"]:
        if variant not in ceilings:  # fp16: no ceiling measured
            continue
        for beam in (1, 5):
            summary = profile_products(
                "profile_decoding", ["--checkpoint", str(args.checkpoint), "--beam-size",
                                     str(beam), "--sentences", str(PROFILE_SENTENCES),
                                     "--precision", variant],
                ceilings[variant])
            results["profiles"].append({"search": f"beam{beam}", "precision": variant, **summary})
            print(products_line(f"decoding beam {beam} {variant}", summary), flush=True)


def print_decoding_row(row: dict, counted: str) -> None:
    single = row.get("single_sentences_per_second")
    print(f"{row['search']:<8} {row['runtime']:<15} {row['sentences_per_second']:>8.1f} "
          f"{row['sentences_per_second_with_startup']:>21.1f} {row['bleu']:>6.2f} {counted} "
          + (f"{single:>9.1f}" if single else f"{'-':>9}"), flush=True)


def bench_checkpoint_decoding(checkpoint: Path, args, runs: dict, ceilings: dict[str, float],
                              results: dict) -> None:
    """The decoding rows of one checkpoint: PyTorch in each variant, ONNX Runtime (fp32, int8)
    and, for a Transformer, CTranslate2 (fp32, int8)."""
    print(f"\ndecoding {checkpoint}, test_2016 ({args.max_sentences or 'all'} sentences)")
    print(f"{'search':<8} {'runtime':<15} {'sent/s':>8} {'sent/s with start-up':>21} "
          f"{'BLEU':>6} {'MFLOP/sent':>10} {'% ceiling':>10} {'1 by 1/s':>9}")
    first = len(results["decoding"])
    for variant in args.decode_variants:
        if variant not in runs["decoding"]:
            print(f"{'-':<8} {variant:<9} skipped: {skip_reason(variant)}")
            continue
        rows = bench_decoding(checkpoint, args.max_sentences, variant)
        for row in rows["results"]:
            flops = row.get("flops_per_sentence")
            # fp16 has no ceiling measured: its rows are not given a share.
            row["percent_of_ceiling"] = None if flops is None or variant not in ceilings \
                else 100 * row["sentences_per_second"] * flops / (ceilings[variant] * 1e9)
            share = row["percent_of_ceiling"]
            counted = (f"{flops / 1e6:>10.1f} " if flops is not None else f"{'-':>10} ") + (
                f"{share:>9.0f}%" if share is not None else f"{'-':>10}")
            record_row(results, row, checkpoint, f"PyTorch {variant}", counted)
    fp32_flops = {row["search"]: row.get("flops_per_sentence")
                  for row in results["decoding"][first:] if row["precision"] == "fp32"}
    try:
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        print("ONNX Runtime rows skipped: pip install '.[export]'")
    with tempfile.TemporaryDirectory() as exports:
        for quantize in EXPORTS if "onnxruntime" in sys.modules else ():
            folder = Path(exports) / quantize
            export = export_for_bench(checkpoint, folder, quantize)
            results.setdefault("exports", []).append(export)
            rows = bench_decoding(folder, args.max_sentences, "fp32", count_flops=False)
            for row in rows["results"]:
                # The graphs run the model's products: the fp32 search's FLOP per sentence.
                flops = fp32_flops.get(row["search"]) if quantize == "none" else None
                row["percent_of_ceiling"] = None if flops is None else (
                    100 * row["sentences_per_second"] * flops / (ceilings["fp32"] * 1e9))
                share = row["percent_of_ceiling"]
                record_row(results, row, checkpoint,
                           f"ONNX RT {'fp32' if quantize == 'none' else quantize}",
                           f"{'-':>10} " + (f"{share:>9.0f}%" if share is not None
                                            else f"{'-':>10}"))
        if is_transformer(checkpoint):
            try:
                import ctranslate2  # noqa: F401
            except ImportError:
                print("CTranslate2 rows skipped: pip install '.[export]'")
            for quantize in EXPORTS if "ctranslate2" in sys.modules else ():
                folder = Path(exports) / f"ctranslate2-{quantize}"
                export = export_for_bench(checkpoint, folder, quantize, output_format="ctranslate2")
                results.setdefault("exports", []).append(export)
                rows = bench_decoding(folder, args.max_sentences, "fp32", count_flops=False)
                for row in rows["results"]:
                    row["percent_of_ceiling"] = None
                    record_row(results, row, checkpoint,
                               f"CTranslate2 {'fp32' if quantize == 'none' else quantize}",
                               f"{'-':>10} {'-':>10}")
    print("exports: " + "; ".join(
        f"{e['format']} {e['quantize']}: {e['export_seconds']:.0f} s, {e['folder_mb']:.1f} MB"
        for e in results.get("exports", []) if e["checkpoint"] == str(checkpoint)), flush=True)


def record_row(results: dict, row: dict, checkpoint: Path, runtime: str, counted: str) -> None:
    row["runtime"], row["checkpoint"] = runtime, str(checkpoint)
    results["decoding"].append(row)
    print_decoding_row(row, counted)


def is_transformer(checkpoint: Path) -> bool:
    from seq2seq.checkpoint import load_checkpoint

    # load_checkpoint gives today's config: built-in parts by registry name.
    return load_checkpoint(checkpoint)["config"]["model"]["decoder"]["_target_"] == "transformer"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-steps", type=int, default=150)
    parser.add_argument("--memory-steps", type=int, default=1000,
                        help="steps of the long memory run (0: skip it)")
    parser.add_argument("--checkpoint", type=Path,
                        default=ROOT / "runs/multi30k_gru_additive/checkpoints/best.pt")
    parser.add_argument("--transformer-checkpoint", type=Path,
                        default=ROOT / "runs/multi30k_transformer/checkpoints/best.pt",
                        help="a Transformer's checkpoint: its rows add CTranslate2's")
    parser.add_argument("--max-sentences", type=int, default=None)
    parser.add_argument("--decode-variants", nargs="+", default=["fp32", "bf16"],
                        choices=["fp32", "bf16", "fp16"], help="autocast dtypes of the search")
    parser.add_argument("--profile-steps", type=int, default=5,
                        help="training steps of each profile in 'where the time goes' (0: skip)")
    parser.add_argument("--presets", nargs="+", choices=sorted({p for p, _ in TRAINING_RUNS}),
                        help="only these presets' training rows (default: all)")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results.json")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")

    machine = {"cpu": cpu_model(), "threads": torch.get_num_threads(),
               "torch": torch.__version__}
    print(f"CPU: {machine['cpu']}, {machine['threads']} threads, torch {machine['torch']}")
    ceilings, line = matmul_ceilings()
    machine["bf16_native"] = "bf16" in ceilings
    machine["matmul_ceiling_gflops"] = ceilings
    print(line)
    runs = runs_for(ceilings, args.decode_variants)
    if args.presets:
        runs["training"] = [run for run in runs["training"] if run[0] in args.presets]
    flops = {preset: flops_per_target_token(preset) for preset, _ in TRAINING_RUNS}
    machine["flops_per_target_token"] = flops
    print("FLOP per target token (matrix products, forward + backward): " + ", ".join(
        f"{preset} {value / 1e6:.1f} M" for preset, value in flops.items()), flush=True)
    results: dict = {"machine": machine, "training": [], "memory": None, "decoding": None}

    print(f"\n{'training preset':<52} {'tgt tok/s (median)':>19} {'% ceiling':>10} {'peak RSS':>10}")
    for preset, precision in runs["training"]:
        row = bench_training(preset, precision, args.train_steps)
        row["percent_of_ceiling"] = (
            100 * row["tokens_per_second_median"] * flops[preset] / (ceilings[precision] * 1e9)
        )
        results["training"].append(row)
        name = f"{preset} trainer.precision={precision}"
        print(f"{name:<52} {row['tokens_per_second_median']:>19,.0f} "
              f"{row['percent_of_ceiling']:>9.0f}% {row['peak_rss_gib']:>8.2f} GiB", flush=True)
    results["ratios"] = training_ratios(results["training"])
    print("ratios: " + ", ".join(f"{name} {value:.2f}x" for name, value in results["ratios"].items()))
    # What precision=auto picks for each preset here (its step timed once per CPU, threads,
    # torch and model, then cached), against the rows just measured: the faster, or within 3 %.
    presets = list(dict.fromkeys(row["preset"] for row in results["training"]))
    choices = auto_choices(presets)
    shares = auto_precision_shares(results["training"],
                                   {preset: chosen for preset, (chosen, _) in choices.items()})
    results["auto_precision"] = {
        preset: {"chosen": chosen, "reason": reason, "share_of_faster": shares.get(preset)}
        for preset, (chosen, reason) in choices.items()}
    for preset, (chosen, reason) in choices.items():
        print(auto_precision_line(preset, chosen, reason, shares.get(preset)), flush=True)
    if args.memory_steps:
        memory_precision = runs["memory_precision"]
        row = bench_training("multi30k_luong_fast", memory_precision, args.memory_steps,
                             log_every=100)
        results["memory"] = row
        print(f"\npeak RSS over {args.memory_steps} steps of multi30k_luong_fast "
              f"({memory_precision}): "
              f"{row['peak_rss_gib']:.2f} GiB ({row['tokens_per_second_median']:,.0f} tok/s)",
              flush=True)
    results["decoding"] = []
    for checkpoint in (args.checkpoint, args.transformer_checkpoint):
        if checkpoint.is_file():
            bench_checkpoint_decoding(checkpoint, args, runs, ceilings, results)
        else:
            print(f"\nno checkpoint at {checkpoint}: its decoding rows skipped "
                  "(train one with `python train.py experiment=PRESET "
                  "hydra.run.dir=runs/PRESET`: multi30k_gru_additive, multi30k_transformer)")
    if args.profile_steps:
        print_profiles(runs, ceilings, args, results)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    print(f"\nwritten to {args.json}")


if __name__ == "__main__":
    main()
