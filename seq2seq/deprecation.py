"""Old import paths kept for one release after a module is renamed, warning once."""

from __future__ import annotations

import importlib
import sys
import warnings


def moved(old: str, new: str, renamed: dict[str, str] | None = None) -> None:
    """Make the module ``old`` (being imported) read every name from ``new``, where it now
    lives (``renamed``: old name -> new name), with one DeprecationWarning saying so."""
    renamed = renamed or {}
    warnings.warn(f"{old} is now {new}"
                  + "".join(f"; {a} is {b}" for a, b in renamed.items())
                  + ": the old path goes in the next release", DeprecationWarning, stacklevel=3)
    module = importlib.import_module(new)
    sys.modules[old].__getattr__ = lambda name: getattr(module, renamed.get(name, name))
