"""Where computations run: the device, the CPU thread count and the autocast dtype."""

from __future__ import annotations

import logging
import os
import platform

import torch

from seq2seq.models.interfaces import PRECISIONS
from seq2seq.precision import Workload, choose_cpu_precision

# The autocast dtype of each precision, in training and in search (fp32: none).
AUTOCAST_DTYPES = dict(zip(PRECISIONS, (None, torch.bfloat16, torch.float16), strict=True))
# What a ``precision`` option accepts: a precision, or ``auto`` (see :func:`decide_precision`).
PRECISION_OPTIONS = ("auto", *PRECISIONS)


def _x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def onednn_half_precision_kernels() -> dict[str, bool] | None:
    """Whether torch has oneDNN kernels for bf16 and for fp16 matrix products on this CPU
    (x86: AVX-512 or AVX-NE-CONVERT for bf16; AVX512-FP16, AVX-NE-CONVERT or AMX-FP16 for fp16;
    Arm: its bf16 extension), or None where torch cannot say.

    Without a kernel torch still runs the product, on a slow fallback, hundreds of times slower
    than fp32 (docs/speed.md).
    """
    try:
        return {"bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
                "fp16": bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())}
    except (AttributeError, RuntimeError):
        return None


def half_precision_warning(precision: str, device: torch.device) -> str | None:
    """One line saying why ``precision`` will be slow on ``device``, or None: bf16 or fp16 on
    a CPU for which torch has no oneDNN kernel of that dtype (see
    :func:`onednn_half_precision_kernels`)."""
    if device.type != "cpu" or precision not in ("bf16", "fp16"):
        return None
    kernels = onednn_half_precision_kernels()
    if kernels is None or kernels[precision]:
        return None
    if _x86():
        needs = ("AVX-512 or AVX-NE-CONVERT" if precision == "bf16"
                 else "AVX512-FP16, AMX-FP16 or AVX-NE-CONVERT")
    else:
        needs = f"the CPU's {precision} extension"
    return (f"precision={precision}: torch has no {precision} matrix kernels for this CPU "
            f"({torch.backends.cpu.get_cpu_capability()}; they need {needs}), so its "
            f"products run on a slow fallback, hundreds of times slower than fp32; "
            f"use precision=fp32 or precision=auto")


_WARNED: set[str] = set()  # the precision warnings this process has given


def choose_precision(precision: str, device: torch.device, *, log: logging.Logger,
                     option: str = "precision", workload: Workload | None = None) -> str:
    """:func:`decide_precision`, logging in one line what ``auto`` chose and why, and, once
    per process (validation builds a translator each time), the :func:`half_precision_warning`
    of the result. ``option`` names the setting in both lines; ``workload`` is
    :func:`decide_precision`'s."""
    chosen, reason = decide_precision(precision, device, workload=workload)
    if precision == "auto":
        log.info("%s=auto -> %s (%s)", option, chosen, reason)
    warning = half_precision_warning(chosen, device)
    if warning is not None and warning not in _WARNED:
        _WARNED.add(warning)
        log.warning(warning.replace("precision=", f"{option}="))
    return chosen


def decide_precision(precision: str, device: torch.device, *,
                     workload: Workload | None = None) -> tuple[str, str]:
    """The precision to run and why, for every caller (training, translate, evaluate, serve).

    ``auto`` is bf16 on CUDA GPUs from Ampere on, and fp32 on older GPUs and MPS; on a CPU,
    the faster of fp32 and bf16 on ``workload`` as :mod:`seq2seq.precision` times it, even
    where torch has no bf16 matrix kernels for the CPU, which the reason then says.
    """
    if precision not in PRECISION_OPTIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISION_OPTIONS)}, "
                         f"got {precision!r}")
    if precision != "auto":
        return precision, "as asked"
    if device.type == "cuda":  # bf16 tensor cores from Ampere (8.x) on; older GPUs emulate it
        if torch.cuda.get_device_capability(device)[0] >= 8:
            return "bf16", f"{device} has bf16 tensor cores"
        return "fp32", f"{device} is older than Ampere and emulates bf16"
    if device.type != "cpu":
        return "fp32", f"auto keeps {device.type} in fp32"
    # Measured also where torch has no bf16 kernels for the CPU: a flag is not a measurement,
    # and the timing of an emulated bf16 stops at its budget.
    choice = choose_cpu_precision(workload)
    reason = choice.describe()
    kernels = onednn_half_precision_kernels()
    if kernels is not None and not kernels["bf16"]:
        reason += (f"; torch has no bf16 matrix kernels for this CPU "
                   f"({torch.backends.cpu.get_cpu_capability()}): emulated")
    return choice.precision, reason


def select_device(name: str | torch.device = "auto", *, local_rank: int = 0) -> torch.device:
    """``auto`` picks CUDA (this rank's GPU), then Apple MPS, then the CPU; a ValueError for an
    unknown device name, or CUDA/MPS asked for but not available."""
    if isinstance(name, torch.device):
        return name
    mps_available = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if mps_available else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(
            f"unknown device {name!r}: use auto, cpu, cuda, cuda:N or mps"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but CUDA is not available here")
    if device.type == "mps" and not mps_available:
        raise ValueError(f"device {name!r} asked for, but MPS is not available here")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
    return device


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def set_num_threads(num_threads: int | None, *, processes: int = 1) -> int:
    """Set torch's CPU threads to ``num_threads``, or (None or 0) to this process's share of the
    cores among ``processes`` (torchrun ranks on one machine); returns the count in force."""
    if num_threads is not None and int(num_threads) < 0:
        raise ValueError(f"num_threads must be positive or null, got {num_threads}")
    threads = int(num_threads) if num_threads else max(available_cores() // processes, 1)
    torch.set_num_threads(threads)
    return threads
