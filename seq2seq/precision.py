"""``precision=auto`` on a CPU: bf16 only where it measures at least 10 % faster than fp32.

A CPU flag is not a measurement: a Xeon with AVX512-BF16 but no AMX multiplies in bf16 at
about 0.6x fp32, an EPYC with the same flag at about 1.6x (docs/speed.md). So the first use on
a CPU times matrix products of the model's own sizes, forward and backward, in fp32 and under
bf16 autocast (a fraction of a second), and the ratio is kept per CPU model and flags, torch
thread count and torch version in the user's cache folder (:func:`default_cache_path`), for
every later run, training and decoding alike.

:func:`choose_cpu_precision` decides; the timing function and the cache file are arguments, so
that tests inject timings and never time anything. ``seq2seq.device`` calls it for ``auto``.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from seq2seq.atomic import write_text

log = logging.getLogger(__name__)

# bf16 is chosen where fp32 time / bf16 time is at least this: a smaller gain is within what
# the rest of a step (and the probe's noise) can eat.
BF16_MIN_SPEEDUP = 1.10
CACHE_DIR_ENV = "SEQ2SEQ_CACHE_DIR"  # overrides $XDG_CACHE_HOME/seq2seq and ~/.cache/seq2seq
CACHE_FILE = "precision.json"
CACHE_FORMAT = 1

# (inputs, outputs) of the products timed when the caller names none: a 512-wide model's
# hidden, feed-forward and 8k-vocabulary output products.
DEFAULT_SHAPES: tuple[tuple[int, int], ...] = ((512, 512), (512, 2048), (2048, 512), (512, 8000))
MAX_SHAPES = 4           # the model's largest distinct products are timed, not all of them
MAX_WIDTH = 2048         # wider sides (a vocabulary) are timed at this width, to stay short
PROBE_FLOPS = 4e8        # per repetition (forward and backward): sets the rows of the products
MIN_ROWS, MAX_ROWS = 32, 256
WARMUP, REPEATS = 1, 5   # pairs of an fp32 and a bf16 repetition
PROBE_BUDGET_S = 0.4     # no pair starts after this, whatever the CPU


@dataclass(frozen=True)
class ProbeTimes:
    """The median seconds of one repetition of the probe's products in each precision."""

    fp32_seconds: float
    bf16_seconds: float


# What a probe function takes: the (inputs, outputs) of each product and the rows to multiply.
Measure = Callable[[Sequence[tuple[int, int]], int], ProbeTimes]


@dataclass(frozen=True)
class CpuIdentity:
    """What a measurement holds for: the CPU model, the threads torch uses, torch's version,
    and a digest of the CPU's instruction-set flags (two CPUs can share a model name: virtual
    machines report "AMD EPYC" for EPYCs with and without bf16 instructions)."""

    cpu: str
    threads: int
    torch_version: str
    features: str = ""

    @classmethod
    def current(cls) -> CpuIdentity:
        return cls(cpu_model_name(), torch.get_num_threads(), torch.__version__, cpu_features())

    @property
    def key(self) -> str:
        flags = f" | flags {self.features}" if self.features else ""
        return f"{self.cpu}{flags} | {self.threads} threads | torch {self.torch_version}"


@dataclass(frozen=True)
class CpuPrecision:
    """The decision and where it came from, for the log line (:meth:`describe`)."""

    precision: str               # "bf16" or "fp32"
    speedup: float               # fp32 time / bf16 time
    measured: str                # the day of the measurement (ISO)
    from_cache: bool             # read from the cache file, not measured now
    probe_seconds: float | None  # how long the probe took (None: read from the cache)
    cache_path: Path | None      # where the measurement is kept (None: it could not be)
    cache_error: str | None = None  # why it could not be kept

    def describe(self, *, decoding: bool = False) -> str:
        """The reason, one line: ``bf16 0.60x fp32 on this CPU, measured now in 0.21 s,
        cached in ~/.cache/seq2seq/precision.json``; ``decoding`` says that a decoder goes by
        the training products' ratio."""
        when = (f"measured {self.measured}" if self.from_cache
                else f"measured now in {self.probe_seconds:.2f} s")
        kept = (f"cached in {_home_relative(self.cache_path)}" if self.cache_path is not None
                else f"not cached: {self.cache_error}")
        shared = " (training products, used for decoding too)" if decoding else ""
        return f"bf16 {self.speedup:.2f}x fp32 on this CPU{shared}, {when}, {kept}"


def default_cache_path() -> Path:
    """``$SEQ2SEQ_CACHE_DIR/precision.json``, else ``$XDG_CACHE_HOME/seq2seq/...``, else
    ``~/.cache/seq2seq/...``."""
    folder = os.environ.get(CACHE_DIR_ENV)
    if not folder:
        folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "seq2seq"
    return Path(folder).expanduser() / CACHE_FILE


def _cpuinfo(*fields: str) -> str | None:
    """The first value of one of ``fields`` in ``/proc/cpuinfo`` (None where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                name, _, value = line.partition(":")
                if name.strip().lower() in fields and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return None


def cpu_model_name() -> str:
    """The CPU's model name as the kernel gives it (``/proc/cpuinfo``), else what Python's
    ``platform`` knows (the architecture at least)."""
    return (_cpuinfo("model name", "hardware") or platform.processor() or platform.machine()
            or "unknown CPU")


def cpu_features() -> str:
    """A short digest of the CPU's flags (``/proc/cpuinfo``'s ``flags`` on x86, ``Features`` on
    Arm); "" where the kernel does not list them."""
    flags = _cpuinfo("flags", "features")
    if flags is None:
        return ""
    return hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:12]


def product_shapes(model: object, *, limit: int = MAX_SHAPES) -> tuple[tuple[int, int], ...] | None:
    """The (inputs, outputs) of ``model``'s largest distinct matrix products, read from its 2-D
    weights (a linear or recurrent layer's, an embedding table as the output layer it is or
    matches), largest first; None for a model that is not a torch module (the probe then uses
    :data:`DEFAULT_SHAPES`)."""
    if not isinstance(model, torch.nn.Module):
        return None
    shapes = {(int(weight.shape[1]), int(weight.shape[0]))
              for weight in model.parameters() if weight.dim() == 2}
    largest = sorted(shapes, key=lambda shape: (shape[0] * shape[1], shape), reverse=True)
    return tuple(largest[:limit]) or None


def probe_products(shapes: Sequence[tuple[int, int]]) -> tuple[int, tuple[tuple[int, int], ...]]:
    """The rows and the (inputs, outputs) the probe multiplies for ``shapes``: sides capped at
    :data:`MAX_WIDTH` (each shape once), rows that keep one repetition (a forward and two backward products per
    shape) near :data:`PROBE_FLOPS`, within [MIN_ROWS, MAX_ROWS]."""
    capped = tuple(dict.fromkeys((min(inputs, MAX_WIDTH), min(outputs, MAX_WIDTH))
                                 for inputs, outputs in shapes))  # each once, in order
    flops_per_row = 6 * sum(inputs * outputs for inputs, outputs in capped)
    rows = int(min(max(PROBE_FLOPS // max(flops_per_row, 1), MIN_ROWS), MAX_ROWS))
    return rows, capped


def measure_products(shapes: Sequence[tuple[int, int]], rows: int) -> ProbeTimes:
    """Time ``rows`` x ``shapes`` products, forward and backward, in fp32 and under bf16
    autocast, on torch's current threads: fp32 and bf16 repetitions alternate (so a neighbour's
    load falls on both), the first :data:`WARMUP` pairs untimed; medians. No pair starts after
    :data:`PROBE_BUDGET_S`."""
    generator = torch.Generator().manual_seed(0)
    operands = [(torch.randn(rows, inputs, generator=generator, requires_grad=True),
                 torch.randn(outputs, inputs, generator=generator, requires_grad=True))
                for inputs, outputs in shapes]
    leaves = [tensor for pair in operands for tensor in pair]

    def step(dtype: torch.dtype | None) -> float:
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            products = [F.linear(rows_in, weight) for rows_in, weight in operands]
        loss = torch.stack([product.float().sum() for product in products]).sum()
        torch.autograd.grad(loss, leaves)
        return time.perf_counter() - start

    started = time.perf_counter()
    fp32, bf16 = [], []
    for pair in range(WARMUP + REPEATS):
        fp32_seconds, bf16_seconds = step(None), step(torch.bfloat16)
        over_budget = time.perf_counter() - started > PROBE_BUDGET_S
        if pair >= WARMUP or (over_budget and not fp32):
            # A warm-up pair over the whole budget is the measurement: one more would not
            # change a decision between products that slow (an emulated bf16).
            fp32.append(fp32_seconds)
            bf16.append(bf16_seconds)
        if over_budget:
            break
    return ProbeTimes(statistics.median(fp32), statistics.median(bf16))


def choose_cpu_precision(
    shapes: Sequence[tuple[int, int]] | None = None,
    *,
    measure: Measure | None = None,
    cache_path: str | os.PathLike | None = None,
    identity: CpuIdentity | None = None,
    today: datetime.date | None = None,
) -> CpuPrecision:
    """bf16 where it is at least :data:`BF16_MIN_SPEEDUP` times as fast as fp32 on this CPU,
    else fp32: the cached ratio of ``identity`` if there is one, else measured now and cached.

    Args:
        shapes: (inputs, outputs) of the products to time (the model's: :func:`product_shapes`);
            None: :data:`DEFAULT_SHAPES`. They only matter when nothing is cached yet.
        measure: the timing function (default :func:`measure_products`); tests inject one.
        cache_path: the JSON file (default :func:`default_cache_path`). An unreadable one is
            ignored with a warning and rewritten; one that cannot be written leaves the
            measurement uncached.
        identity: what the measurement holds for (default: this CPU, threads and torch).
        today: the date recorded with a new measurement (default: today).
    """
    measure = measure or measure_products
    path = Path(cache_path) if cache_path is not None else default_cache_path()
    identity = identity or CpuIdentity.current()
    entries = _read_cache(path)
    entry = entries.get(identity.key)
    if entry is not None:
        try:
            speedup, measured = float(entry["speedup"]), str(entry["measured"])
        except (KeyError, TypeError, ValueError):
            log.warning("precision cache %s: the entry for %s is unreadable; measuring again",
                        path, identity.key)
        else:
            return CpuPrecision(_decide(speedup), speedup, measured, from_cache=True,
                                probe_seconds=None, cache_path=path)

    rows, shapes = probe_products(shapes or DEFAULT_SHAPES)
    started = time.perf_counter()
    times = measure(shapes, rows)
    probe_seconds = time.perf_counter() - started
    speedup = times.fp32_seconds / max(times.bf16_seconds, 1e-12)
    measured = (today or datetime.date.today()).isoformat()
    entries[identity.key] = {
        "cpu": identity.cpu, "threads": identity.threads, "torch": identity.torch_version,
        "speedup": round(speedup, 4), "precision": _decide(speedup), "measured": measured,
        "fp32_ms": round(times.fp32_seconds * 1e3, 3),
        "bf16_ms": round(times.bf16_seconds * 1e3, 3),
        "products": ", ".join(f"{rows}x{inputs}x{outputs}" for inputs, outputs in shapes),
    }
    cache_error = None
    try:
        write_text(path, json.dumps({"format": CACHE_FORMAT, "measurements": entries},
                                    indent=1, sort_keys=True) + "\n")
    except OSError as error:  # a read-only home still trains, measuring each time
        cache_error = f"{type(error).__name__}: {error.strerror or error}"
    return CpuPrecision(_decide(speedup), speedup, measured, from_cache=False,
                        probe_seconds=probe_seconds, cache_path=None if cache_error else path,
                        cache_error=cache_error)


def _decide(speedup: float) -> str:
    return "bf16" if speedup >= BF16_MIN_SPEEDUP else "fp32"


def _read_cache(path: Path) -> dict[str, dict]:
    """The cache's measurements by key; {} for a missing file, and with a warning for one
    that cannot be read or is not this format (it is rewritten on the next measurement)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as error:
        log.warning("precision cache %s is unreadable (%s); ignoring it", path, error)
        return {}
    try:
        content = json.loads(text)
        if content.get("format") != CACHE_FORMAT or not isinstance(
                content.get("measurements"), dict):
            raise ValueError(f"not format {CACHE_FORMAT} with a 'measurements' table")
    except (ValueError, AttributeError) as error:
        log.warning("precision cache %s is corrupt (%s); ignoring it", path, error)
        return {}
    return {key: entry for key, entry in content["measurements"].items()
            if isinstance(entry, dict)}


def _home_relative(path: Path) -> str:
    try:
        return f"~/{path.relative_to(Path.home())}"
    except ValueError:
        return str(path)
