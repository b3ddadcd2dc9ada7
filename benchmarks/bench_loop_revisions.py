"""Decoding speed of this tree against an earlier revision's, alternated on the same model.

    python -m benchmarks.bench_loop_revisions runs/x/checkpoints/best.pt [--old 996179a] \\
        [--rounds 3] [--max-sentences 1000] [--threads 2] [--same-output 200]

The earlier revision (``git archive``, kept in ``--work``) and this tree each export the
checkpoint to ONNX in float32 and in int8 with their own ``export.py``; then, round after
round, each tree's own ``benchmarks.bench_decoding`` translates the checkpoint's test split with
greedy search and beam 5 on each of the three models (PyTorch fp32, ONNX Runtime fp32 and
int8). The trees alternate within a round and swap order the next, so a slower minute of the
machine falls on both. It prints every round's generation sentences/s and, per model and
search, the medians and this tree's against the old one's (above 1: faster now).

``--same-output N`` first checks that both trees translate the first N test sentences alike
with each tree's own ``translate.py``, on each of the three models: greedy search, beam 5 with
its 3-best and their scores, constraints (line i: the second word of line i's greedy
translation), prefixes (the same word) and a seeded sample (2 draws, ``top_p=0.9``). A
difference is printed and ends the run with status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"pytorch fp32": None, "onnx fp32": "none", "onnx int8": "int8"}


def old_tree(revision: str, work: Path) -> Path:
    """``revision``'s files under ``work`` (extracted once), its ``data`` this tree's."""
    tree = work / f"tree-{revision}"
    if not (tree / "seq2seq").is_dir():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    data = tree / "data"
    if not data.exists() and (ROOT / "data").exists():
        data.symlink_to(ROOT / "data")
    return tree


def run_in(tree: Path, args: list[str], threads: int) -> None:
    """``python ARGS`` with ``tree`` first on the path (its own package and benchmarks)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads)}
    subprocess.run([sys.executable, *args], cwd=tree, env=env, check=True,
                   stdout=subprocess.DEVNULL)


def export(tree: Path, checkpoint: Path, folder: Path, quantize: str, threads: int) -> Path:
    if not (folder / "manifest.json").is_file():
        run_in(tree, ["export.py", f"checkpoint={checkpoint}", f"output={folder}",
                      f"quantize={quantize}", "overwrite=true"], threads)
    return folder


def bench(tree: Path, model: Path, args, report: Path) -> dict[str, float]:
    """Generation sentences/s of greedy search and beam 5: {"greedy": ..., "beam5": ...}."""
    run_in(tree, ["-m", "benchmarks.bench_decoding", "--checkpoint", str(model),
                  "--beam-sizes", "1", "5", "--max-sentences", str(args.max_sentences),
                  "--num-threads", str(args.threads), "--device", "cpu",
                  "--json", str(report)], args.threads)
    rows = json.loads(report.read_text(encoding="utf-8"))["results"]
    return {row["search"]: row["sentences_per_second"] for row in rows}


OUTPUT_CHECKS = {  # name: translate.py options
    "greedy": ["beam_size=1"],
    "beam 5, 3-best with scores": ["beam_size=5", "nbest=3"],
    "constraints": ["beam_size=5", "constraints={words}"],
    "prefixes": ["beam_size=5", "prefix={words}"],
    "seeded sample": ["search=sample", "seed=1", "nbest=2", "top_p=0.9"],
}


def translate(tree: Path, model: Path, source: Path, output: Path, options: list[str],
              threads: int) -> list[str]:
    run_in(tree, ["translate.py", f"checkpoint={model}", f"input={source}", f"output={output}",
                  "device=cpu", *options], threads)
    return output.read_text(encoding="utf-8").splitlines()


def same_output(trees: dict[str, Path], models: dict, sentences: int, args) -> bool:
    """Whether both trees translate the first ``sentences`` test sentences alike (above)."""
    from seq2seq.inference.evaluation import read_parallel, split_files
    from seq2seq.inference.model_files import load_model_payload

    work = args.work / "same_output"
    work.mkdir(parents=True, exist_ok=True)
    src_path, ref_path = split_files(load_model_payload(args.checkpoint)["config"], "test")
    source = work / "source.txt"
    source.write_text("".join(line + "\n" for line in read_parallel(src_path, ref_path)[0]
                              [:sentences]), encoding="utf-8")
    greedy = translate(trees["new"], args.checkpoint, source, work / "greedy.txt",
                       ["beam_size=1"], args.threads)
    words = work / "words.txt"  # a word each translation can write
    words.write_text("".join((line.split()[1] if len(line.split()) > 1 else "") + "\n"
                             for line in greedy), encoding="utf-8")
    same = True
    for model in MODELS:
        for check, options in OUTPUT_CHECKS.items():
            options = [option.format(words=words) for option in options]
            old, new = (translate(trees[name], models[name, model], source,
                                  work / f"{name}.txt", options, args.threads)
                        for name in ("old", "new"))
            differing = [i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b]
            if len(old) != len(new) or differing:
                same = False
                print(f"{model:>12} {check}: DIFFERENT ({len(differing)} lines; first "
                      f"{differing[:1]}; {len(old)} against {len(new)} lines)", flush=True)
            else:
                print(f"{model:>12} {check}: the same {len(new)} lines", flush=True)
    return same


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--old", default="996179a", help="the revision to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-sentences", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bench_loop")
    parser.add_argument("--same-output", type=int, default=0, metavar="N",
                        help="first check both trees translate the first N sentences alike")
    args = parser.parse_args(argv)
    checkpoint = args.checkpoint = args.checkpoint.resolve()
    trees = {"old": old_tree(args.old, args.work), "new": ROOT}
    models = {
        (name, model): checkpoint if quantize is None else
        export(tree, checkpoint, args.work / f"{name}-{quantize}", quantize, args.threads)
        for name, tree in trees.items() for model, quantize in MODELS.items()}
    if args.same_output and not same_output(trees, models, args.same_output, args):
        return 1
    speeds: dict[tuple[str, str, str], list[float]] = {}
    for round_number in range(args.rounds):
        order = ["old", "new"] if round_number % 2 == 0 else ["new", "old"]
        for model in MODELS:
            for name in order:
                found = bench(trees[name], models[name, model], args,
                              args.work / f"{name}-{round_number}.json")
                for search, speed in found.items():
                    speeds.setdefault((model, search, name), []).append(speed)
                print(f"round {round_number + 1} {model:>12} {name}: " + ", ".join(
                    f"{search} {speed:.1f}" for search, speed in found.items()), flush=True)
    print(f"\nmedian sentences/s over {args.rounds} rounds ({args.old} against this tree)")
    print(f"{'model':>12} {'search':>7} {'old':>8} {'new':>8} {'new/old':>8}")
    for model in MODELS:
        for search in ("greedy", "beam5"):
            old = statistics.median(speeds[model, search, "old"])
            new = statistics.median(speeds[model, search, "new"])
            print(f"{model:>12} {search:>7} {old:8.1f} {new:8.1f} {new / old:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
