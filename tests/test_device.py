"""seq2seq/device.py (precision and torch's CPU probes) and seq2seq/onednn_caches.py (the bounds on
oneDNN's per-shape caches that the entry points set)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import seq2seq.device
from seq2seq.device import (
    decide_precision,
    half_precision_warning,
    onednn_half_precision_kernels,
)
from seq2seq.onednn_caches import (
    MATMUL_SETUP_CACHE,
    MATMUL_SETUP_CACHE_ENV,
    ONEDNN_CACHE_ENV,
    TRAINING_ONEDNN_CACHE,
    bound_onednn_caches,
)
from seq2seq.precision import CpuPrecision, Workload

CPU = torch.device("cpu")


def cpu_flags() -> set[str]:
    with open("/proc/cpuinfo", encoding="utf-8") as info:
        for line in info:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo") or "x86" not in os.uname().machine,
                    reason="the probes and /proc/cpuinfo flags are x86 Linux ones")
def test_the_cpu_probes_agree_with_the_cpus_flags():
    """torch's private dtype probes answer, and answer what the kernel says; if a torch release
    drops them, this fails instead of auto measuring an emulated bf16 and the warning going
    quiet."""
    flags = cpu_flags()
    kernels = onednn_half_precision_kernels()
    assert kernels is not None, "torch.ops.mkldnn's dtype probes are gone: see seq2seq/device.py"
    if {"avx512bw", "avx512vl", "avx512dq"} <= flags or "avx_ne_convert" in flags:
        assert kernels["bf16"]
    if not {"avx512bw", "avx_ne_convert"} & flags:  # AVX2 only, as the Zen 1 EPYC
        assert kernels == {"bf16": False, "fp16": False}


def fake_cpu_choice(precision: str, speedup: float) -> CpuPrecision:
    return CpuPrecision(precision, speedup, "2026-11-27", from_cache=True, probe_seconds=None,
                        cache_path=None, cache_error="test")


@pytest.mark.parametrize(("kernels", "speedup", "expected"),
                         [(True, 1.6, "bf16"), (True, 0.6, "fp32"), (None, 1.6, "bf16")])
def test_auto_precision_on_a_cpu_goes_by_the_measurement(monkeypatch, kernels, speedup,
                                                         expected):
    """Where torch has bf16 kernels, or cannot say, auto takes the probe's decision."""
    asked = []
    monkeypatch.setattr(seq2seq.device, "onednn_half_precision_kernels",
                        lambda: None if kernels is None else {"bf16": kernels, "fp16": False})
    monkeypatch.setattr(seq2seq.device, "choose_cpu_precision", lambda workload: asked.append(
        workload) or fake_cpu_choice(expected, speedup))
    step = Workload("the step", lambda: pytest.fail("timed"))
    assert decide_precision("auto", CPU, workload=step)[0] == expected
    assert asked == [step]  # the caller's own work reaches the measurement
    chosen, reason = decide_precision("auto", CPU)
    assert chosen == expected and reason.startswith(f"bf16 {speedup:.2f}x fp32 on this CPU")


def test_auto_precision_on_a_cpu_without_bf16_kernels_is_measured_too(monkeypatch):
    """No decision from a flag: the probe decides, and the reason says bf16 is emulated."""
    asked = []
    monkeypatch.setattr(seq2seq.device, "onednn_half_precision_kernels",
                        lambda: {"bf16": False, "fp16": False})
    monkeypatch.setattr(seq2seq.device, "choose_cpu_precision", lambda workload: asked.append(
        workload) or fake_cpu_choice("fp32", 0.25))
    chosen, reason = decide_precision("auto", CPU)
    assert chosen == "fp32" and asked == [None]
    assert reason.startswith("bf16 0.25x fp32 on this CPU, measured 2026-11-27")
    assert reason.endswith("; torch has no bf16 matrix kernels for this CPU "
                           f"({torch.backends.cpu.get_cpu_capability()}): emulated")


def test_explicit_precisions_are_kept_and_others_refused(monkeypatch):
    monkeypatch.setattr(seq2seq.device, "choose_cpu_precision", lambda workload: pytest.fail(
        "measured for an explicit precision or another device"))
    assert decide_precision("auto", torch.device("mps"))[0] == "fp32"
    for explicit in ("fp32", "bf16", "fp16"):  # an explicit choice is kept, on any CPU
        assert decide_precision(explicit, CPU) == (explicit, "as asked")
    with pytest.raises(ValueError, match="precision must be one of auto, fp32, bf16, fp16"):
        decide_precision("fp8", CPU)


@pytest.mark.parametrize(("capability", "expected"), [((7, 0), "fp32"), ((8, 0), "bf16")])
def test_auto_precision_on_a_gpu_is_bf16_from_ampere_on(monkeypatch, capability, expected):
    """Older GPUs emulate bf16 (torch.cuda.is_bf16_supported() says True there by default)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert decide_precision("auto", torch.device("cuda", 0))[0] == expected


def test_half_precision_warns_only_where_torch_has_no_kernel_for_it(monkeypatch):
    monkeypatch.setattr(seq2seq.device, "onednn_half_precision_kernels",
                        lambda: {"bf16": False, "fp16": False})
    warning = half_precision_warning("bf16", CPU)
    assert warning is not None and "\n" not in warning
    assert warning.startswith("precision=bf16: torch has no bf16 matrix kernels for this CPU")
    assert "precision=fp32" in warning
    assert "AMX-FP16" in half_precision_warning("fp16", CPU)
    assert half_precision_warning("fp32", CPU) is None
    assert half_precision_warning("bf16", torch.device("cuda")) is None
    monkeypatch.setattr(seq2seq.device, "onednn_half_precision_kernels",
                        lambda: {"bf16": True, "fp16": False})
    assert half_precision_warning("bf16", CPU) is None
    assert half_precision_warning("fp16", CPU) is not None
    monkeypatch.setattr(seq2seq.device, "onednn_half_precision_kernels", lambda: None)
    assert half_precision_warning("bf16", CPU) is None  # unknown: no claim made


def test_bound_onednn_caches_sets_defaults_and_keeps_the_users_choice(monkeypatch):
    monkeypatch.delenv(ONEDNN_CACHE_ENV, raising=False)
    monkeypatch.delenv(MATMUL_SETUP_CACHE_ENV, raising=False)
    bound_onednn_caches()
    assert os.environ[ONEDNN_CACHE_ENV] == str(TRAINING_ONEDNN_CACHE)
    assert os.environ[MATMUL_SETUP_CACHE_ENV] == str(MATMUL_SETUP_CACHE)
    monkeypatch.setenv(ONEDNN_CACHE_ENV, "256")
    monkeypatch.setenv(MATMUL_SETUP_CACHE_ENV, "64")
    bound_onednn_caches()
    assert os.environ[ONEDNN_CACHE_ENV] == "256"
    assert os.environ[MATMUL_SETUP_CACHE_ENV] == "64"


def test_decoding_keeps_onednns_kernel_cache_and_bounds_the_matmul_setups(monkeypatch):
    monkeypatch.delenv(ONEDNN_CACHE_ENV, raising=False)
    monkeypatch.delenv(MATMUL_SETUP_CACHE_ENV, raising=False)
    bound_onednn_caches(kernels=None)
    assert ONEDNN_CACHE_ENV not in os.environ
    assert os.environ[MATMUL_SETUP_CACHE_ENV] == str(MATMUL_SETUP_CACHE)


def test_the_training_entry_point_bounds_both_caches_first():
    # main() sets them before anything else, --help included (importing sets nothing).
    code = (f"import os, sys; os.environ.pop({ONEDNN_CACHE_ENV!r}, None); "
            f"os.environ.pop({MATMUL_SETUP_CACHE_ENV!r}, None); import seq2seq.cli.train as t; "
            f"assert {ONEDNN_CACHE_ENV!r} not in os.environ; sys.argv = ['train.py', '--help']\n"
            "try:\n    t.main()\nexcept SystemExit:\n    pass\n"
            f"print(os.environ[{ONEDNN_CACHE_ENV!r}], os.environ[{MATMUL_SETUP_CACHE_ENV!r}], "
            "file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.split() == [str(TRAINING_ONEDNN_CACHE), str(MATMUL_SETUP_CACHE)]


# One bf16 linear layer, forward and backward, on 120 batch sizes: the heap in use (glibc's
# mallinfo2) after them minus before, in MiB. oneDNN's own kernel cache is switched off so
# that only the set-up cache this bound is about can grow.
HEAP_GROWTH = textwrap.dedent("""
    import ctypes, sys
    import torch
    from seq2seq.onednn_caches import bound_onednn_caches
    bound_onednn_caches(kernels=0)

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks",
                    "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    torch.set_num_threads(1)
    layer = torch.nn.Linear(256, 512)

    def step(rows):
        inputs = torch.randn(rows, 256, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outputs = layer(inputs)
        outputs.float().sum().backward()

    step(8)
    before = libc.mallinfo2().uordblks
    for rows in range(9, 129):
        step(rows)
    print((libc.mallinfo2().uordblks - before) / 2**20)
""")


def _heap_growth_mib(matmul_setups: str | None) -> float:
    """None: the variable unset, so the script's own bound_onednn_caches() call (after torch
    is imported, as in the decoding entry points) sets it."""
    env = {**os.environ, MATMUL_SETUP_CACHE_ENV: matmul_setups or ""}
    if matmul_setups is None:
        env.pop(MATMUL_SETUP_CACHE_ENV)
    env.pop(ONEDNN_CACHE_ENV, None)
    result = subprocess.run([sys.executable, "-c", HEAP_GROWTH], capture_output=True,
                            text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    return float(result.stdout.strip())


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="needs glibc's mallinfo2 and a CPU on which torch runs bf16 products through oneDNN",
)
def test_the_matmul_setup_bound_stops_the_bf16_heap_growing_with_every_shape():
    # With torch's default the heap grows by roughly a megabyte per new shape; with the bound
    # it does not grow. If a torch release drops the variable, the bounded run grows too.
    unbounded = _heap_growth_mib("1024")
    bounded = _heap_growth_mib(None)
    assert unbounded > 30, f"no growth to bound with torch's default ({unbounded:.1f} MiB)"
    assert bounded < 5, f"the heap grew by {bounded:.1f} MiB with the bound"
