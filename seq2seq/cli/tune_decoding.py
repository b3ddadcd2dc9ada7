"""``seq2seq-tune-decoding checkpoint=PATH [overrides]``: choose the beam size and length
penalty on the validation set, never on a test set.

Scores every beam size x length penalty through the function ``seq2seq-evaluate`` uses
(:func:`seq2seq.inference.evaluation.evaluate_translations`), so a cell's BLEU is the BLEU
``seq2seq-evaluate split=valid beam_size=B length_penalty=A`` prints; examples, and what it
prints, refuses and keeps: docs/evaluate-translate.md, "Tuning decoding on val".
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from seq2seq.atomic import write_text
from seq2seq.cli.app import hydra_tool
from seq2seq.cli.common import check_types, checkpoint_paths, fail, require_checkpoint_files
from seq2seq.cli.decoding_request import (
    changed_options,
    check_config,
    refuse_unused,
    start_decoding,
)


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
                **{key: evaluation.scores[key] for key in ("bleu", "chrf", "length_ratio")},
                "sentences_per_second": evaluation.sentences_per_second,
                "generation_seconds": evaluation.generation_seconds,
                "evaluated": True,
            }
            cells.append(cell)
            if beam_size == 1:
                greedy = cell
    return cells


def format_table(cells: Sequence[dict], beam_sizes, length_penalties) -> str:
    by_key = {(c["beam_size"], c["length_penalty"]): c for c in cells}

    def row(first: object, texts: Sequence[str]) -> str:
        return f"{first:>5} | " + " | ".join(f"{text:^24}" for text in texts)

    header = row("beam", [f"lp={lp:g}" for lp in length_penalties])
    lines = [
        "BLEU, length ratio (r: output/reference length) and sentences/s per beam size (rows) "
        "and length penalty (columns)",
        header,
        "-" * len(header),
    ]
    for beam_size in beam_sizes:
        row_cells = [by_key[beam_size, lp] for lp in length_penalties]
        lines.append(row(beam_size, [f"{c['bleu']:6.2f} r{c['length_ratio']:.3f} "
                                     f"({c['sentences_per_second']:7.1f})" for c in row_cells]))
    if 1 in beam_sizes:
        lines.append("beam 1 is greedy search: the length penalty does not change it, it was "
                     "translated once and stands in every column")
    return "\n".join(lines)


def evaluate_command(cfg: DictConfig, paths: list[str], best: dict) -> str:
    """The one ``seq2seq-evaluate`` command that reports ``best`` on the test set."""
    named = paths[0] if len(paths) == 1 else f"[{','.join(paths)}]"
    parts = ["seq2seq-evaluate", f"checkpoint={named}"]
    parts += ["src=YOUR_TEST_SRC", "ref=YOUR_TEST_REF"] if cfg.src is not None else ["split=test"]
    if cfg.search != "beam":
        parts.append(f"search={cfg.search}")
    parts += [f"beam_size={best['beam_size']}", f"length_penalty={best['length_penalty']:g}"]
    parts += [f"{key}={value}" for key, value in changed_options(
        cfg, ("precision", "quantize", "shortlist", "batch.max_tokens", "max_source_length"))]
    return " ".join(shlex.quote(part) for part in parts)


def _same_file(a, b) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def check_tune_config(cfg: DictConfig) -> list[str]:
    """The checkpoint paths, after every option is checked: a one-line error (and exit) on a
    bad value, a test split, or a decoding option the grid sets."""
    check_config(cfg)
    if OmegaConf.is_missing(cfg, "checkpoint") or not cfg.checkpoint:
        fail("no checkpoint given: add checkpoint=PATH")
    check_types(cfg, {"max_sentences": int | None, "split": str, "src": str | None,
                      "ref": str | None, "json": str | None})
    for key, kind in (("beam_sizes", int), ("length_penalties", float)):
        values = cfg[key]
        if not OmegaConf.is_list(values) or not values or not all(
                isinstance(value, int | float) and not isinstance(value, bool)
                and (kind is float or isinstance(value, int)) for value in values):
            what = "integers" if kind is int else "numbers"
            fail(f"{key}: expected a list of {what} ([1,3,5]), got {values}")
    refuse_unused(cfg, ("beam_size", "length_penalty", "nbest"), "tune-decoding tries every "
                  "cell of beam_sizes x length_penalties and returns the best translation; "
                  "set those instead")
    if cfg.split == "test":
        fail("tuning on the test split is not allowed: tune on split=valid (or your own "
             "src/ref dev files), then score the chosen setting on test once")
    if cfg.split != "valid":
        fail(f"split must be valid, got {cfg.split!r}")
    if (cfg.src is None) != (cfg.ref is None):
        fail("src and ref go together")
    if cfg.max_sentences is not None and cfg.max_sentences < 1:
        fail(f"max_sentences must be positive, got {cfg.max_sentences}")
    paths = checkpoint_paths(cfg.checkpoint)
    require_checkpoint_files(paths)
    return paths


def run(cfg: DictConfig) -> dict:
    """Tune as configured; returns the report (what ``json=`` writes)."""
    paths = check_tune_config(cfg)
    beam_sizes = sorted(set(cfg.beam_sizes))
    length_penalties = sorted(set(float(value) for value in cfg.length_penalties))
    request = start_decoding(cfg)
    from seq2seq.checkpoint import CheckpointError
    from seq2seq.data.text_files import DataError
    from seq2seq.inference.decode_options import DecodeOptions
    from seq2seq.inference.evaluation import read_parallel, split_files

    try:
        for beam_size in beam_sizes:  # every cell's options, checked before the model loads
            for length_penalty in length_penalties:
                DecodeOptions(search=cfg.search, beam_size=beam_size,
                              length_penalty=length_penalty)
        if request.options.search_method.draws:
            fail(f"search={cfg.search} draws at random, so its scores are noise: tune a search "
                 "that does not (beam)")
        opened = request.open(paths, cfg.device)
        translator = opened.translator
        if cfg.src is not None:
            src_path, ref_path = Path(cfg.src), Path(cfg.ref)
            try:
                test_files = split_files(opened.config, "test")
            except DataError:
                test_files = ()
            if any(map(_same_file, (src_path, ref_path), test_files)):
                fail("these are the checkpoint's test files: tuning on the test split is not "
                     "allowed")
        else:
            src_path, ref_path = split_files(opened.config, "valid")
        sources, references = read_parallel(src_path, ref_path)
        if cfg.max_sentences is not None:
            sources, references = sources[: cfg.max_sentences], references[: cfg.max_sentences]
        if not sources:
            fail(f"{src_path} holds no sentences")
        cells = tune(translator, sources, references, beam_sizes, length_penalties,
                     search=cfg.search)
    except (CheckpointError, DataError, ValueError) as error:
        fail(error)

    # Highest BLEU; ties: the first in grid order (the smaller beam, the earlier penalty).
    best = max(cells, key=lambda cell: cell["bleu"])
    command = evaluate_command(cfg, paths, best)
    where = "valid split" if cfg.src is None else str(src_path)
    print(f"{len(sources)} sentences of {where} ({src_path}), device {translator.device}, "
          f"precision {cfg.precision}")
    print(format_table(cells, beam_sizes, length_penalties))
    print(f"best on {where}: beam_size={best['beam_size']} "
          f"length_penalty={best['length_penalty']:g} BLEU {best['bleu']:.2f}, length ratio "
          f"{best['length_ratio']:.3f}"
          + (" (greedy: the length penalty does not matter)"
             if cfg.search == "beam" and best["beam_size"] == 1 else "")
          + (" (short output: a larger length penalty lengthens beam search's)"
             if best["length_ratio"] < 1 and best["beam_size"] > 1 else ""))
    print("report it on the test set, once:")
    print(f"  {command}", flush=True)
    report = {
        "checkpoint": paths[0] if len(paths) == 1 else paths,
        "split": "valid" if cfg.src is None else None,
        "src": str(src_path),
        "ref": str(ref_path),
        "sentences": len(sources),
        "device": str(translator.device),
        "precision": cfg.precision,
        "max_tokens": cfg.batch.max_tokens,
        "search": cfg.search,
        "beam_sizes": beam_sizes,
        "length_penalties": length_penalties,
        "cells": cells,
        "best": best,
        "test_command": command,
    }
    if cfg.json:
        write_text(Path(cfg.json), json.dumps(report, indent=2) + "\n")
        print(f"wrote {cfg.json}", file=sys.stderr)
    return report


# The previous release's flags, still read (with a warning): --name VALUE is name=VALUE.
FLAGS = {"--beam-sizes": "beam_sizes", "--length-penalties": "length_penalties",
         "--search": "search", "--split": "split", "--src": "src", "--ref": "ref",
         "--max-sentences": "max_sentences", "--device": "device",
         "--max-tokens": "batch.max_tokens", "--precision": "precision",
         "--num-threads": "num_threads", "--json": "json"}
# ``seq2seq-tune-decoding``: see the module docstring (``--help`` lists the options).
main = hydra_tool(run, config_name="tune_decoding", summary=__doc__.splitlines()[0],
                  bare="checkpoint", old_flags=FLAGS, lists=("beam_sizes", "length_penalties"),
                  bare_is_old=True)


if __name__ == "__main__":
    main()
