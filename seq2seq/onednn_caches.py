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
    """Bound the two per-shape caches behind torch's CPU matrix products, which grow with each
    new batch shape (docs/training.md#memory-on-the-cpu), each only where the user has not set
    its variable. Both are read when first used: this must run before the first matrix product
    of the process.

    ``kernels``: oneDNN's compiled kernels (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``; None leaves
    oneDNN's 1,024, as decoding does: too small a bound recompiles the step-by-step decoder's
    kernels). The bf16 products' set-ups (``LRU_CACHE_CAPACITY``, read by torch's oneDNN
    bindings) are bounded to :data:`MATMUL_SETUP_CACHE`; the kernels stay in oneDNN's cache.
    """
    if kernels is not None:
        os.environ.setdefault(ONEDNN_CACHE_ENV, str(kernels))
    os.environ.setdefault(MATMUL_SETUP_CACHE_ENV, str(MATMUL_SETUP_CACHE))
