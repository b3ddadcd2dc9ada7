"""Rendering a prepared-data summary (`summary.json`) as the table the tools print."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_HEADER = (
    "split",
    "pairs read",
    "kept",
    "dropped",
    "empty",
    "too long",
    "ratio",
    "src mean",
    "tgt mean",
)


def _count(value: int) -> str:
    return f"{value:,}"


def format_summary(summary: Mapping[str, Any]) -> str:
    """Renders a `PreparedData.summary` as a table, one line per split (and one per
    training corpus when there are several)."""
    languages = summary.get("languages")
    pair = f"{languages[0]} -> {languages[1]}" if languages else "source -> target"
    if summary.get("cache_hit"):
        status = (
            f"cache hit, loaded in {summary['seconds']:.2f} s "
            f"(built in {summary.get('build_seconds', 0.0):.1f} s)"
        )
    else:
        status = f"built in {summary['seconds']:.1f} s"
    rows = [_HEADER, *(_split_row(split, stats) for split, stats in summary["splits"].items())]
    widths = [max(len(row[column]) for row in rows) for column in range(len(_HEADER))]
    lines = [f"Data summary: {pair}, {status}", f"  cache: {summary['cache_dir']}"]
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  " + "  ".join(cells).rstrip())
    lines.extend(_corpus_line(corpus) for corpus in summary.get("corpora") or ())
    lines.append(
        f"  vocabulary: {_vocabulary(summary)}; src/tgt mean: pieces per kept sentence, "
        "no bos/eos"
    )
    return "\n".join(lines)


def _corpus_line(corpus: Mapping[str, Any]) -> str:
    """One training corpus: its pairs kept, tag, weight and the share of the pairs it gets."""
    tag = f", tag {corpus['tag']}" if corpus.get("tag") else ""
    return (
        f"  corpus {corpus['name']}: {_count(corpus['pairs_kept'])} of "
        f"{_count(corpus['pairs_read'])} pairs kept{tag}, weight {corpus['weight']:g} "
        f"({100 * corpus['share']:.1f} % of the pairs drawn)"
    )


def _split_row(split: str, stats: Mapping[str, Any]) -> tuple[str, ...]:
    if stats["filtered"]:
        dropped = stats["dropped"]
        drop_cells = (
            _count(sum(dropped.values())),
            _count(dropped["empty"]),
            _count(dropped["too_long"]),
            _count(dropped["length_ratio"]),
        )
    else:
        drop_cells = ("not filtered", "", "", "")
    return (
        split,
        _count(stats["pairs_read"]),
        _count(stats["pairs_kept"]),
        *drop_cells,
        f"{stats['src_mean_pieces']:.1f}",
        f"{stats['tgt_mean_pieces']:.1f}",
    )


def _vocabulary(summary: Mapping[str, Any]) -> str:
    tokenizer = summary["tokenizer"]
    vocab = summary["vocab_size"]
    asked = f" (asked for {tokenizer['vocab_size']:,})"
    if summary["joint"]:
        text = f"joint {tokenizer['model_type']}, {vocab['src']:,} pieces"
        if vocab["src"] < tokenizer["vocab_size"]:
            text += asked
        if vocab["tgt"] != vocab["src"]:
            text += f", of which the target side keeps {vocab['tgt']:,}"
        return text
    text = f"{tokenizer['model_type']}, source {vocab['src']:,} / target {vocab['tgt']:,} pieces"
    if min(vocab["src"], vocab["tgt"]) < tokenizer["vocab_size"]:
        text += asked
    return text
