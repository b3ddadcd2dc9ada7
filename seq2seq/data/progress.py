"""Progress bars of the data stage's long steps (reading and encoding corpora)."""

from __future__ import annotations

import sys
from typing import Any


def progress_bar(*, description: str, enabled: bool | None) -> Any:
    """A tqdm bar counting pairs on stderr, shown only for steps lasting over two seconds.

    Args:
        description: The bar's label.
        enabled: True or False to force it on or off; None: only when stderr is a terminal.
    """
    from tqdm import tqdm

    return tqdm(
        desc=description,
        unit=" pairs",
        unit_scale=True,
        file=sys.stderr,
        delay=2.0,
        leave=False,
        disable=None if enabled is None else not enabled,
    )
