"""The terminal during long work: progress bars with a total and an ETA, log lines that print
above a bar instead of onto it, and records meant for the log file only.

A record logged with ``extra=FILE_ONLY`` goes to the run's log file but not to the terminal
(the whole model's printout, the loss lines a visible bar already shows), once
:func:`keep_file_only_records_off_console` has filtered the console handlers.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

FILE_ONLY = {"console": False}


class _ConsoleFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, "console", True)


def _is_console(handler: logging.Handler) -> bool:
    return (isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
            and getattr(handler, "stream", None) in (sys.stdout, sys.stderr))


def keep_file_only_records_off_console(logger: logging.Logger | None = None) -> None:
    """Filter ``extra=FILE_ONLY`` records out of the console handlers of ``logger`` (root)."""
    for handler in (logger or logging.getLogger()).handlers:
        if _is_console(handler) and not any(isinstance(f, _ConsoleFilter) for f in handler.filters):
            handler.addFilter(_ConsoleFilter())


@contextmanager
def logs_above_bars(active: bool = True) -> Iterator[None]:
    """While bars are drawn, console log lines are written above them (``tqdm.write``), never
    onto a bar's line; the console handlers' filters come along."""
    if not active:
        yield
        return
    from tqdm.contrib.logging import logging_redirect_tqdm

    root = logging.getLogger()
    filters = [f for handler in root.handlers if _is_console(handler) for f in handler.filters]
    with logging_redirect_tqdm():
        for handler in root.handlers:
            if type(handler).__name__ == "_TqdmLoggingHandler":
                for log_filter in filters:
                    handler.addFilter(log_filter)
        yield


def count_bar(total: int | None, *, description: str, unit: str, enabled: bool | None = None,
              leave: bool = False, unit_scale: bool = False) -> Any:
    """A tqdm bar over ``total`` items (None: a count without an end) on stderr, with an ETA;
    on a terminal only (``enabled`` None: when stderr is one), shown once the work has lasted
    two seconds."""
    from tqdm import tqdm

    return tqdm(total=total, desc=description, unit=unit, unit_scale=unit_scale, file=sys.stderr,
                delay=2.0, leave=leave, dynamic_ncols=True,
                disable=None if enabled is None else not enabled)

