"""Choose the beam size and length penalty on the validation set, never on a test set.

    seq2seq-tune-decoding runs/x/checkpoints/best.pt \\
        --beam-sizes 1,3,5,8 --length-penalties 0.6,1.0,1.4 [--split valid] \\
        [--max-sentences N] [--json tune.json]
    seq2seq-tune-decoding best.pt --src dev.de --ref dev.en ...   # your own dev set
    seq2seq-tune-decoding runs/a/checkpoints/best.pt runs/b/checkpoints/best.pt  # an ensemble

Loads the checkpoint once (several: decoded as one ensemble, as ``seq2seq-evaluate
'checkpoint=[A,B]'`` does; the valid split is the first one's) and scores every beam size x
length penalty on the ``valid`` split of the checkpoint's own data config (or on
``--src``/``--ref``) through :func:`seq2seq.inference.evaluation.evaluate_translations`, the
path ``seq2seq-evaluate`` takes, so a cell's BLEU is the BLEU ``seq2seq-evaluate split=valid
beam_size=B length_penalty=A`` prints.

Prints a table (rows: beam size; columns: length penalty; cells: BLEU, sacreBLEU's length
ratio of the output to the references, then sentences/s), the best setting (ties go to the
smaller beam, then the earlier length penalty) with its length ratio, and the one
``seq2seq-evaluate`` command that reports that setting on the test set, to run once. A ratio
below 1 means short output, which BLEU's brevity penalty punishes: a larger length penalty
lengthens beam search's output.

Greedy search (beam size 1) ranks nothing, so the length penalty cannot change it: it is
translated once and its BLEU stands in every column of its row. ``--search NAME`` tunes another
registered search (:mod:`seq2seq.inference.searches`) over the same grid; one that draws at
random is refused (its scores would be noise).

``--split test``, and ``--src`` files that are the checkpoint's test split, are refused:
settings tuned on a test set make its score an overestimate. A bad option is a one-line
error before torch loads.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from seq2seq.config_types import error_reason


def _number_list(kind):
    def parse(text: str) -> list:
        try:
            values = [kind(item) for item in text.split(",") if item.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {kind.__name__}s, got {text!r}"
            ) from None
        if not values:
            raise argparse.ArgumentTypeError("expected at least one value")
        return sorted(set(values))

    return parse


def _beam_sizes(text: str) -> list[int]:
    values = _number_list(int)(text)
    if values[0] < 1:
        raise argparse.ArgumentTypeError(f"beam sizes must be at least 1, got {values[0]}")
    return values


def _length_penalties(text: str) -> list[float]:
    values = _number_list(float)(text)
    if values[0] < 0:
        raise argparse.ArgumentTypeError(f"length penalties must be >= 0, got {values[0]}")
    return values


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def tune(translator, sources, references, beam_sizes, length_penalties, *,
         search: str = "beam") -> list[dict]:
    """Score every (beam size, length penalty) cell of ``search`` (a registered search); beam
    search's greedy row is translated once."""
    from seq2seq.inference.decode_options import DecodeOptions
    from seq2seq.inference.evaluation import evaluate_translations

    cells = []
    for beam_size in beam_sizes:
        greedy = None
        for length_penalty in length_penalties:
            if search == "beam" and beam_size == 1 and greedy is not None:
                cells.append({**greedy, "length_penalty": length_penalty, "evaluated": False})
                continue
            options = DecodeOptions(search=search, beam_size=beam_size,
                                    length_penalty=length_penalty)
            evaluation = evaluate_translations(translator, sources, references, options)
            cell = {
                "beam_size": beam_size,
                "length_penalty": length_penalty,
                "bleu": evaluation.scores["bleu"],
                "chrf": evaluation.scores["chrf"],
                "length_ratio": evaluation.scores["length_ratio"],
                "sentences_per_second": evaluation.sentences_per_second,
                "generation_seconds": evaluation.generation_seconds,
                "evaluated": True,
            }
            cells.append(cell)
            if beam_size == 1:
                greedy = cell
    return cells


def best_cell(cells: Sequence[dict]) -> dict:
    """Highest BLEU; ties: the smaller beam, then the earlier length penalty (grid order)."""
    best = cells[0]
    for cell in cells[1:]:
        if cell["bleu"] > best["bleu"]:
            best = cell
    return best


def format_table(cells: Sequence[dict], beam_sizes, length_penalties) -> str:
    by_key = {(c["beam_size"], c["length_penalty"]): c for c in cells}
    width = 24
    header = f"{'beam':>5} | " + " | ".join(
        f"{f'lp={lp:g}':^{width}}" for lp in length_penalties
    )
    lines = [
        "BLEU, length ratio (r: output/reference length) and sentences/s per beam size (rows) "
        "and length penalty (columns)",
        header,
        "-" * len(header),
    ]
    for beam_size in beam_sizes:
        texts = []
        for lp in length_penalties:
            cell = by_key[beam_size, lp]
            text = (f"{cell['bleu']:6.2f} r{cell['length_ratio']:.3f} "
                    f"({cell['sentences_per_second']:7.1f})")
            texts.append(f"{text:^{width}}")
        row = " | ".join(texts)
        lines.append(f"{beam_size:>5} | {row}")
    if 1 in beam_sizes:
        lines.append("beam 1 is greedy search: the length penalty does not change it, it was "
                     "translated once and stands in every column")
    return "\n".join(lines)


def evaluate_command(args, best: dict) -> str:
    checkpoints = args.checkpoint
    named = checkpoints[0] if len(checkpoints) == 1 else f"[{','.join(checkpoints)}]"
    parts = ["seq2seq-evaluate", f"checkpoint={named}"]
    if args.src is not None:
        parts += ["src=YOUR_TEST_SRC", "ref=YOUR_TEST_REF"]
    else:
        parts.append("split=test")
    if args.search != "beam":
        parts.append(f"search={args.search}")
    parts += [f"beam_size={best['beam_size']}", f"length_penalty={best['length_penalty']:g}"]
    if args.precision != "fp32":
        parts.append(f"precision={args.precision}")
    if args.max_tokens != 4000:
        parts.append(f"batch.max_tokens={args.max_tokens}")
    return " ".join(shlex.quote(part) for part in parts)


def _same_file(a, b) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="seq2seq-tune-decoding",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", nargs="+",
                        help="a checkpoint file; several: decoded as one ensemble")
    parser.add_argument("--beam-sizes", type=_beam_sizes, default=[1, 3, 5, 8],
                        help="comma-separated, e.g. 1,3,5,8")
    parser.add_argument("--length-penalties", type=_length_penalties, default=[0.6, 1.0, 1.4],
                        help="comma-separated GNMT alphas, e.g. 0.6,1.0,1.4")
    parser.add_argument("--search", default="beam",
                        help="the registered search tuned (seq2seq.inference.searches): beam, "
                             "or one your code registered")
    parser.add_argument("--split", default=None,
                        help="valid (the default; test is refused): a split of the "
                             "checkpoint's data config")
    parser.add_argument("--src", default=None, help="tune on these source sentences instead")
    parser.add_argument("--ref", default=None, help="... and these references (with --src)")
    parser.add_argument("--max-sentences", type=_positive_int, default=None,
                        help="use the first N sentences only")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps")
    parser.add_argument("--max-tokens", type=_positive_int, default=4000,
                        help="padded source ids per batch")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                        help="autocast dtype of the search")
    parser.add_argument("--num-threads", type=_positive_int, default=None,
                        help="CPU threads for torch")
    parser.add_argument("--json", default=None, help="also write the results here as JSON")
    args = parser.parse_args(argv)
    def fail(message: str, status: int = 2) -> int:
        print(f"error: {message}", file=sys.stderr)
        return status

    if args.split == "test":
        return fail("tuning on the test split is not allowed: tune on --split valid (or your "
                    "own --src/--ref dev files), then score the chosen setting on test once")
    if args.split not in (None, "valid"):
        return fail(f"--split must be valid, got {args.split!r}")
    if (args.src is None) != (args.ref is None):
        return fail("--src and --ref go together")
    if args.src is not None and args.split is not None:
        return fail("give either --split or --src/--ref, not both")

    from seq2seq.cli.common import set_up_decoding

    set_up_decoding(args.num_threads)  # as seq2seq-translate does
    from seq2seq.checkpoint import CheckpointError
    from seq2seq.data.corpus import DataError
    from seq2seq.inference.evaluation import read_parallel, split_files
    from seq2seq.inference.runtimes import open_model
    from seq2seq.inference.searches import search_named

    try:
        if search_named(args.search).draws:  # (an unknown name: a ValueError naming the known)
            return fail(f"--search {args.search} draws at random, so its scores are noise: "
                        "tune a search that does not (beam)")
        opened = open_model(args.checkpoint, args.device, max_tokens=args.max_tokens,
                            precision=args.precision)
        translator = opened.translator
        if args.src is not None:
            src_path, ref_path = Path(args.src), Path(args.ref)
            try:
                test_src, test_ref = split_files(opened.config, "test")
            except DataError:
                test_src = test_ref = None
            if test_src is not None and (
                _same_file(src_path, test_src) or _same_file(ref_path, test_ref)
            ):
                return fail("these are the checkpoint's test files: tuning on the test split "
                            "is not allowed")
        else:
            src_path, ref_path = split_files(opened.config, "valid")
        sources, references = read_parallel(src_path, ref_path)
        if args.max_sentences is not None:
            sources, references = sources[: args.max_sentences], references[: args.max_sentences]
        if not sources:
            return fail(f"{src_path} holds no sentences", 1)
        cells = tune(translator, sources, references, args.beam_sizes, args.length_penalties,
                     search=args.search)
    except (CheckpointError, DataError, ValueError) as error:
        return fail(error_reason(error), 1)

    best = best_cell(cells)
    command = evaluate_command(args, best)
    where = "valid split" if args.src is None else str(src_path)
    print(f"{len(sources)} sentences of {where} ({src_path}), device {translator.device}, "
          f"precision {args.precision}")
    print(format_table(cells, args.beam_sizes, args.length_penalties))
    print(f"best on {where}: beam_size={best['beam_size']} "
          f"length_penalty={best['length_penalty']:g} BLEU {best['bleu']:.2f}, length ratio "
          f"{best['length_ratio']:.3f}"
          + (" (greedy: the length penalty does not matter)"
             if args.search == "beam" and best["beam_size"] == 1 else "")
          + (" (short output: a larger length penalty lengthens beam search's)"
             if best["length_ratio"] < 1 and best["beam_size"] > 1 else ""))
    print("report it on the test set, once:")
    print(f"  {command}", flush=True)
    if args.json:
        report = {
            "checkpoint": args.checkpoint[0] if len(args.checkpoint) == 1 else args.checkpoint,
            "split": "valid" if args.src is None else None,
            "src": str(src_path),
            "ref": str(ref_path),
            "sentences": len(sources),
            "device": str(translator.device),
            "precision": args.precision,
            "max_tokens": args.max_tokens,
            "search": args.search,
            "beam_sizes": args.beam_sizes,
            "length_penalties": args.length_penalties,
            "cells": cells,
            "best": best,
            "test_command": command,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
