"""The report's markdown: tables and sections of one heading, a note and a table."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A markdown table's lines."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(cells) + " |" for cells in rows]


def section(title: str, note: str, header: Sequence[str],
            rows: Iterable[Sequence[str]]) -> list[str]:
    """``## title``, the note, the table and a blank line."""
    return [f"## {title}", "", note, "", *table(header, rows), ""]
