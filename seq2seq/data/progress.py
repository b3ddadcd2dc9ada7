"""Progress bars of the data stage's long steps (reading and encoding corpora)."""

from __future__ import annotations

from typing import Any

from seq2seq.console import count_bar


def progress_bar(*, description: str, enabled: bool | None) -> Any:
    """A bar counting pairs on stderr, shown only for steps lasting over two seconds.

    Args:
        description: The bar's label.
        enabled: True or False to force it on or off; None: only when stderr is a terminal.
    """
    return count_bar(None, description=description, unit=" pairs", unit_scale=True,
                     enabled=enabled)
