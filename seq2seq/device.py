"""Where computations run: the device, the CPU thread count and the autocast dtype."""

from __future__ import annotations

import os

import torch

# The autocast dtype of each ``precision`` option, in training and in search (fp32: none).
AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


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


ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
TRAINING_ONEDNN_CACHE = 128


def bound_onednn_cache(capacity: int = TRAINING_ONEDNN_CACHE) -> None:
    """Keep at most ``capacity`` compiled oneDNN kernels, unless the user set the variable.

    oneDNN (torch's CPU matrix library) compiles a kernel per operation and shape and caches
    1,024 of them by default. Training sees a new batch shape at nearly every step, so the
    cache kept growing: over 1,000 steps of ``multi30k_luong_fast`` (bf16, AMD EPYC) the peak
    resident memory was 3.23 GiB with the default, 2.18 GiB with 128 and 1.88 GiB with 8, at
    the same speed. 8 is too few for the step-by-step decoder (input feeding), whose one step
    uses more distinct kernels than that: ``multi30k_gru_additive`` in bf16 lost 22% of its
    speed with 8 and none with 128 (peak over 150 steps 1.72 -> 1.34 GiB). oneDNN reads the
    variable when it first builds a kernel, so this must run before the first matrix product.
    """
    os.environ.setdefault(ONEDNN_CACHE_ENV, str(capacity))
