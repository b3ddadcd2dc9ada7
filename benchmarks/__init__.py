"""Benchmarks and profilers of the library, run from the repository root as modules:
``python -m benchmarks.bench`` (``make bench``), ``python -m benchmarks.bench_decoding`` ...

Not part of the installed package; they import :mod:`seq2seq` and each other (``benchmarks.x``).
"""
