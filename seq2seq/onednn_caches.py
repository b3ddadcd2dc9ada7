"""Bounds on the per-shape caches behind torch's CPU matrix products, set through environment
variables.

Free of torch on purpose, so that the entry points can import it at the top and refuse a bad
option without importing torch. train.py's main() sets the bounds first, the decoding tools
before their first matrix product (``seq2seq.cli.common.set_up_decoding``). docs/speed.md has
the measurements behind the values.
"""

from __future__ import annotations

import os

ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
TRAINING_ONEDNN_CACHE = 128
MATMUL_SETUP_CACHE_ENV = "LRU_CACHE_CAPACITY"
MATMUL_SETUP_CACHE = 1


def bound_onednn_caches(*, kernels: int | None = TRAINING_ONEDNN_CACHE) -> None:
    """Bound the two per-shape caches behind torch's CPU matrix products.

    Each bound is set only when the user has not set its variable. Both are read when first
    used, so this must run before the first matrix product of the process.

    - ``kernels`` (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``; None leaves oneDNN's 1,024): oneDNN
      compiles a kernel per operation and shape, and training sees a new batch shape at nearly
      every step, so an unbounded cache grows the memory; too small a bound recompiles the
      step-by-step decoder's kernels. Decoding keeps the default.
    - matrix product set-ups (``LRU_CACHE_CAPACITY``, read by torch's oneDNN bindings; set to
      :data:`MATMUL_SETUP_CACHE`): torch keeps a set-up object per bf16 matrix product and
      shape, which grew bf16 training's memory with every new batch shape; the kernels
      themselves stay in oneDNN's cache.
    """
    if kernels is not None:
        os.environ.setdefault(ONEDNN_CACHE_ENV, str(kernels))
    os.environ.setdefault(MATMUL_SETUP_CACHE_ENV, str(MATMUL_SETUP_CACHE))
