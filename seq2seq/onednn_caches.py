"""Bounds on the per-shape caches behind torch's CPU matrix products, set through environment
variables.

Free of torch on purpose, so that the entry points can import it at the top and still load
torch only once they have work for it: translate.py, evaluate.py, serve.py and
tune_decoding.py refuse a bad option, and train.py an unknown key, prints ``--help`` or
``--cfg job``, without torch's import (2.5 s on a 2-core AMD EPYC, Zen 1). train.py sets the
bounds when it is imported, the decoding tools before their first matrix product.
"""

from __future__ import annotations

import os

ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
TRAINING_ONEDNN_CACHE = 128
MATMUL_SETUP_CACHE_ENV = "LRU_CACHE_CAPACITY"
MATMUL_SETUP_CACHE = 1


def bound_onednn_caches(
    *, kernels: int | None = TRAINING_ONEDNN_CACHE, matmul_setups: int = MATMUL_SETUP_CACHE
) -> None:
    """Bound the two per-shape caches behind torch's CPU matrix products.

    Each bound is set only when the user has not set its variable. Both are read when first
    used, so this must run before the first matrix product of the process.

    - ``kernels`` (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``; None leaves oneDNN's 1,024): oneDNN
      compiles a kernel per operation and shape. Training sees a new batch shape at nearly
      every step: over 1,000 steps of ``multi30k_luong_fast`` (bf16, AMD EPYC) the peak
      resident memory was 3.23 GiB with 1,024, 2.18 GiB with 128 and 1.88 GiB with 8, at
      the same speed. 8 is too few for the step-by-step decoder (input feeding), whose one
      step uses more kernels than that: ``multi30k_gru_additive`` in bf16 lost 22% of its
      speed with 8 and none with 128. Decoding keeps 1,024: 128 cost greedy search 17%.
    - ``matmul_setups`` (``LRU_CACHE_CAPACITY``, read by torch's oneDNN bindings, 1,024 by
      default): torch keeps a set-up object per bf16 matrix product and shape. This was
      the bf16 memory that grew with every new batch shape: one bf16 linear layer run
      forward and backward on 200 row counts grew the heap in use by 155 MiB with 1,024
      and by 0.01 MiB with 1. Over 1,000 steps of ``multi30k_luong_fast`` (bf16) the peak
      went from 2.26 to 1.14 GiB, the heap in use between steps stayed at
      0.26 GiB instead of doubling, and neither training nor decoding got slower: the
      kernels themselves stay in oneDNN's cache above.
    """
    if kernels is not None:
        os.environ.setdefault(ONEDNN_CACHE_ENV, str(kernels))
    os.environ.setdefault(MATMUL_SETUP_CACHE_ENV, str(matmul_setups))
