"""Where computations run: the device, the CPU thread count and the autocast dtype."""

from __future__ import annotations

import logging
import os
import platform

import torch

# The autocast dtype of each ``precision`` option, in training and in search (fp32: none).
AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# What ``precision`` accepts: a dtype above, or ``auto`` (see :func:`resolve_precision`).
PRECISIONS = ("auto", *AUTOCAST_DTYPES)


def _x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def native_bf16_cpu() -> bool | None:
    """Whether this CPU has bf16 matrix instructions (AVX512-BF16 or AMX), where bf16 products
    run about twice as fast as fp32; None where torch cannot say (its probes, the ones its
    compiler uses, are x86 ones): unknown, not absent."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    if not _x86():
        return None
    if not all(hasattr(torch.cpu, name) for name in probes):
        return None
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


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
                     option: str = "precision") -> str:
    """:func:`resolve_precision`, logging what ``auto`` chose and, once per process (validation
    builds a translator each time), the :func:`half_precision_warning` of the result.
    ``option`` names the setting in both lines."""
    chosen = resolve_precision(precision, device)
    if precision == "auto":
        log.info("%s=auto: %s on %s", option, chosen, device)
    warning = half_precision_warning(chosen, device)
    if warning is not None and warning not in _WARNED:
        _WARNED.add(warning)
        log.warning(warning.replace("precision=", f"{option}="))
    return chosen


def resolve_precision(precision: str, device: torch.device) -> str:
    """The precision to run: ``precision`` itself, or for ``auto`` ``bf16`` where ``device``
    multiplies bf16 natively (CUDA GPUs with bf16, x86 CPUs with AVX512-BF16 or AMX) and
    ``fp32`` elsewhere (MPS, older GPUs, CPUs without those instructions or that torch cannot
    probe).

    Raises:
        ValueError: for a value not in :data:`PRECISIONS`.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision != "auto":
        return precision
    if device.type == "cuda":  # bf16 tensor cores from Ampere (8.x) on; older GPUs emulate it
        return "bf16" if torch.cuda.get_device_capability(device)[0] >= 8 else "fp32"
    if device.type == "cpu":
        return "bf16" if native_bf16_cpu() else "fp32"
    return "fp32"


def select_device(name: str | torch.device = "auto", *, local_rank: int = 0) -> torch.device:
    """``auto`` picks CUDA (this rank's GPU), then Apple MPS, then the CPU.

    Raises:
        ValueError: for an unknown device name, or CUDA/MPS asked for but not available.
    """
    if isinstance(name, torch.device):
        return name
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(
            f"unknown device {name!r}: use auto, cpu, cuda, cuda:N or mps"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but CUDA is not available here")
    if device.type == "mps" and not (
        getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()
    ):
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
    """Set torch's CPU threads: ``num_threads``, or this process's share of the cores.

    Args:
        num_threads: an explicit count; None or 0: ``available_cores() // processes``.
        processes: processes sharing the cores (torchrun ranks on one machine).

    Returns:
        The thread count now in force.
    """
    if num_threads is not None and int(num_threads) < 0:
        raise ValueError(f"num_threads must be positive or null, got {num_threads}")
    threads = int(num_threads) if num_threads else max(available_cores() // processes, 1)
    torch.set_num_threads(threads)
    return threads
