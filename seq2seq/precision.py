"""``precision=auto`` on a CPU: the faster of fp32 and bf16, timed on the work it decides for.

Neither a CPU flag nor a matrix product tells which is faster (docs/speed.md#bf16-on-cpus), so
the first use on a CPU times a :class:`Workload`: training, the model's own training step at
the run's batch shape; decoding, the model's own greedy search of a batch. The ratio is kept
per CPU model and flags, torch thread count, torch version and workload in the user's cache
folder (:func:`default_cache_path`) for every later run. A caller with no model to time falls
back on matrix products of fixed sizes (:func:`product_workload`), under a wider margin.

:func:`choose_cpu_precision` decides; the workload's timing function and the cache file are
arguments, so that tests inject timings and never time anything.
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

# bf16 is chosen where fp32 time / bf16 time of the work itself is at least this: fp32 (exact
# to the formula) where the two are within 3 %, so auto never runs at under 97 % of the faster.
BF16_MIN_SPEEDUP = 1.03
# The same for the products-only fallback: the rest of a step can eat a gain this small.
PRODUCTS_MIN_SPEEDUP = 1.10
CACHE_DIR_ENV = "SEQ2SEQ_CACHE_DIR"  # overrides $XDG_CACHE_HOME/seq2seq and ~/.cache/seq2seq
CACHE_FILE = "precision.json"
CACHE_FORMAT = 2  # 1 held one products ratio per CPU; 2 one ratio per CPU and workload

# (inputs, outputs) of the products timed when the caller names none: a 512-wide model's
# hidden, feed-forward and 8k-vocabulary output products.
DEFAULT_SHAPES: tuple[tuple[int, int], ...] = ((512, 512), (512, 2048), (2048, 512), (512, 8000))
MAX_WIDTH = 2048         # wider sides (a vocabulary) are timed at this width, to stay short
PROBE_FLOPS = 4e8        # per repetition (forward and backward): sets the rows of the products
MIN_ROWS, MAX_ROWS = 32, 256
WARMUP, REPEATS = 1, 5   # pairs of an fp32 and a bf16 repetition
PROBE_BUDGET_S = 0.4     # the products: no pair starts after this, whatever the CPU
STEP_REPEATS = 4         # a workload's timed pairs (each a step or a search in both modes)
STEP_BUDGET_S = 12.0     # no pair of a workload starts after this


@dataclass(frozen=True)
class ProbeTimes:
    """The median seconds of one repetition of the work in each precision."""

    fp32_seconds: float
    bf16_seconds: float


@dataclass(frozen=True)
class Workload:
    """What ``auto`` times: ``name`` (the cache's key beside the CPU's, and the log's words,
    e.g. "the training step of Seq2Seq 7.1 M parameters [06ad85] on 1,600-token batches"), the
    timing function, and the speed-up bf16 needs to be chosen."""

    name: str
    measure: Callable[[], ProbeTimes]
    min_speedup: float = BF16_MIN_SPEEDUP


# One repetition of the work under autocast to the dtype (None: fp32); the argument is the
# pair's number (a workload of several batches runs pair i on batch i in both precisions).
Repetition = Callable[[torch.dtype | None, int], None]


def time_alternately(repetition: Repetition, *, warmup: int = WARMUP, repeats: int = REPEATS,
                     budget_s: float = PROBE_BUDGET_S) -> ProbeTimes:
    """Median seconds of ``repetition`` in fp32 and under bf16 autocast, the two alternating (so
    that a neighbour's load falls on both), the first ``warmup`` pairs untimed. No pair starts
    after ``budget_s``; a warm-up pair over the whole budget is the measurement (one more would
    not change a decision between modes that far apart: an emulated bf16)."""
    started = time.perf_counter()
    fp32, bf16 = [], []
    for pair in range(warmup + repeats):
        times = []
        for dtype in (None, torch.bfloat16):
            begun = time.perf_counter()
            repetition(dtype, pair)
            times.append(time.perf_counter() - begun)
        over_budget = time.perf_counter() - started > budget_s
        if pair >= warmup or (over_budget and not fp32):
            fp32.append(times[0])
            bf16.append(times[1])
        if over_budget:
            break
    return ProbeTimes(statistics.median(fp32), statistics.median(bf16))


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
    workload: str = ""              # what was timed (Workload.name)

    def describe(self) -> str:
        """The reason, one line: ``bf16 1.45x fp32 on this CPU for the training step of ...,
        measured now in 4.10 s, cached in ~/.cache/seq2seq/precision.json``."""
        when = (f"measured {self.measured}" if self.from_cache
                else f"measured now in {self.probe_seconds:.2f} s")
        kept = (f"cached in {_home_relative(self.cache_path)}" if self.cache_path is not None
                else f"not cached: {self.cache_error}")
        timed = f" for {self.workload}" if self.workload else ""
        return f"bf16 {self.speedup:.2f}x fp32 on this CPU{timed}, {when}, {kept}"


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


def model_description(model) -> str:
    """``Seq2Seq 7.1 M parameters [3f2a9c]``: the class, the size (a
    :class:`~seq2seq.models.interfaces.DecodingModel`'s ``parameter_count``) and, for a torch
    module, a digest of its parameter names and shapes, for a workload's name (two models of
    one size but other layers are timed apart)."""
    digest = ""
    if isinstance(model, torch.nn.Module):
        shapes = [(name, tuple(weight.shape)) for name, weight in model.named_parameters()]
        digest = f" [{hashlib.sha256(repr(shapes).encode()).hexdigest()[:6]}]"
    return f"{type(model).__name__} {model.parameter_count / 1e6:.1f} M parameters{digest}"


def probe_products(shapes: Sequence[tuple[int, int]]) -> tuple[int, tuple[tuple[int, int], ...]]:
    """The rows and the (inputs, outputs) the probe multiplies for ``shapes``: sides capped at
    :data:`MAX_WIDTH` (each shape once), rows that keep one repetition (a forward and two backward products per
    shape) near :data:`PROBE_FLOPS`, within [MIN_ROWS, MAX_ROWS]."""
    capped = tuple(dict.fromkeys((min(inputs, MAX_WIDTH), min(outputs, MAX_WIDTH))
                                 for inputs, outputs in shapes))  # each once, in order
    flops_per_row = 6 * sum(inputs * outputs for inputs, outputs in capped)
    rows = int(min(max(PROBE_FLOPS // max(flops_per_row, 1), MIN_ROWS), MAX_ROWS))
    return rows, capped


def autocast(device_type: str, dtype: torch.dtype | None) -> torch.autocast:
    """Autocast to ``dtype`` on ``device_type``; None: fp32 (autocast off)."""
    return torch.autocast(device_type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def measure_products(shapes: Sequence[tuple[int, int]], rows: int) -> ProbeTimes:
    """Time ``rows`` x ``shapes`` products, forward and backward, in fp32 and under bf16
    autocast, on torch's current threads (:func:`time_alternately`, within
    :data:`PROBE_BUDGET_S`)."""
    generator = torch.Generator().manual_seed(0)
    operands = [(torch.randn(rows, inputs, generator=generator, requires_grad=True),
                 torch.randn(outputs, inputs, generator=generator, requires_grad=True))
                for inputs, outputs in shapes]
    leaves = [tensor for pair in operands for tensor in pair]

    def repetition(dtype: torch.dtype | None, _pair: int) -> None:
        with autocast("cpu", dtype):
            products = [F.linear(rows_in, weight) for rows_in, weight in operands]
        loss = torch.stack([product.float().sum() for product in products]).sum()
        torch.autograd.grad(loss, leaves)

    return time_alternately(repetition)


def product_workload(shapes: Sequence[tuple[int, int]] | None = None, *,
                     measure: Callable[[Sequence[tuple[int, int]], int], ProbeTimes]
                     = measure_products) -> Workload:
    """The fallback workload of a caller with no model step to time: matrix products of
    ``shapes`` (None: :data:`DEFAULT_SHAPES`), forward and backward, a fraction of a second;
    bf16 needs :data:`PRODUCTS_MIN_SPEEDUP` here."""
    rows, capped = probe_products(shapes or DEFAULT_SHAPES)
    name = "matrix products " + ", ".join(f"{rows}x{inputs}x{outputs}"
                                          for inputs, outputs in capped)
    return Workload(name, lambda: measure(capped, rows), min_speedup=PRODUCTS_MIN_SPEEDUP)


def choose_cpu_precision(
    workload: Workload | None = None,
    *,
    cache_path: str | os.PathLike | None = None,
    identity: CpuIdentity | None = None,
    today: datetime.date | None = None,
) -> CpuPrecision:
    """bf16 where ``workload`` (None: :func:`product_workload` of the default shapes) runs at
    least ``workload.min_speedup`` times as fast in bf16 as in fp32 on this CPU, else fp32: the
    cached ratio of ``identity`` (None: this CPU, threads and torch) and the workload if there is
    one, else measured now (on ``today``) and cached in ``cache_path`` (None:
    :func:`default_cache_path`). An unreadable cache is ignored with a warning and rewritten; one
    that cannot be written leaves the measurement uncached.
    """
    workload = workload or product_workload()
    path = Path(cache_path) if cache_path is not None else default_cache_path()
    identity = identity or CpuIdentity.current()
    key = f"{identity.key} | {workload.name}"
    entries = _read_cache(path)
    entry = entries.get(key)
    if entry is not None:
        try:
            speedup, measured = float(entry["speedup"]), str(entry["measured"])
        except (KeyError, TypeError, ValueError):
            log.warning("precision cache %s: the entry for %s is unreadable; measuring again",
                        path, key)
        else:
            return CpuPrecision(_decide(speedup, workload), speedup, measured, from_cache=True,
                                probe_seconds=None, cache_path=path, workload=workload.name)

    started = time.perf_counter()
    times = workload.measure()
    probe_seconds = time.perf_counter() - started
    speedup = times.fp32_seconds / max(times.bf16_seconds, 1e-12)
    measured = (today or datetime.date.today()).isoformat()
    entries[key] = {
        "cpu": identity.cpu, "threads": identity.threads, "torch": identity.torch_version,
        "workload": workload.name, "speedup": round(speedup, 4),
        "precision": _decide(speedup, workload), "measured": measured,
        "fp32_ms": round(times.fp32_seconds * 1e3, 3),
        "bf16_ms": round(times.bf16_seconds * 1e3, 3),
    }
    cache_error = None
    try:
        write_text(path, json.dumps({"format": CACHE_FORMAT, "measurements": entries},
                                    indent=1, sort_keys=True) + "\n")
    except OSError as error:  # a read-only home still trains, measuring each time
        cache_error = f"{type(error).__name__}: {error.strerror or error}"
    return CpuPrecision(_decide(speedup, workload), speedup, measured, from_cache=False,
                        probe_seconds=probe_seconds, cache_path=None if cache_error else path,
                        cache_error=cache_error, workload=workload.name)


def _decide(speedup: float, workload: Workload) -> str:
    return "bf16" if speedup >= workload.min_speedup else "fp32"


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
        if content.get("format") == 1:  # products ratios per CPU alone: measured anew
            log.info("precision cache %s holds the products of an earlier version; "
                     "measuring the work itself", path)
            return {}
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
