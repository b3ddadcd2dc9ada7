"""Where a GPU training step of ``experiment=multi30k_transformer_gpu`` goes (CUDA only).

    python -m benchmarks.probe_gpu_attention        (about a minute; a copy in $OUT/probe.txt)

The GPU check of 2026-11-28 (docs/results.md#gpu-check) found the step at about 190 ms, 0.5 %
of an H200's bf16 ceiling, with ``scaled_dot_product_attention`` holding the Python thread
10.5 ms a call. Length-bucketed batches bring a new (B, S, T) nearly every step, so this times
each attention backend forward and backward with the model's boolean key mask both at one
repeated shape and at shapes it has not seen (a backend that builds a plan per shape, as cuDNN's
does, pays that at each new one); then whole training steps of the preset's model (forward,
backward, clipping, the finiteness check, fused AdamW) at three batch sizes with new shapes each
step, with and without cuDNN's attention; the host synchronisations one step makes; and the
profiler's operators by host time and by GPU time.
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

HEADS, HEAD_DIM, VOCAB = 4, 64, 8000
DEVICE = "cuda"
BACKENDS = {"default": None, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
WITHOUT_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def wall_ms(function) -> float:
    """Host wall-clock milliseconds of one call of ``function``, the GPU's work included."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    function()
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - start)


def shapes(max_tokens: int, count: int, seed: int) -> list[tuple[int, int, int]]:
    """(B, S, T) as length-bucketed batches of ``max_tokens`` padded tokens make them."""
    draw = random.Random(seed)
    out = []
    for _ in range(count):
        source, target = draw.randint(8, 40), draw.randint(8, 40)
        out.append((max(1, max_tokens // max(source, target)), source, target))
    return out


def attention_call(batch: int, length: int, backend) -> None:
    q, k, v = (torch.randn(batch, HEADS, length, HEAD_DIM, device=DEVICE, dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    keys = torch.ones(batch, length, dtype=torch.bool, device=DEVICE)
    keys[1::2, length * 3 // 4:] = False  # every other sentence shorter
    with contextlib.nullcontext() if backend is None else sdpa_kernel(backend):
        F.scaled_dot_product_attention(q, k, v, attn_mask=keys[:, None, None, :],
                                       dropout_p=0.1).sum().backward()


def probe_attention() -> None:
    print("\n== attention forward + backward, boolean key mask, dropout 0.1, bf16 "
          "(ms a call, host wall-clock) ==")
    new_shapes = shapes(25600, 12, seed=1)
    for name, backend in BACKENDS.items():
        try:
            for _ in range(3):
                attention_call(1550, 20, backend)
            repeated = statistics.median(wall_ms(lambda b=backend: attention_call(1550, 20, b))
                                         for _ in range(10))
            new = [wall_ms(lambda b=batch, n=length, k=backend: attention_call(b, n, k))
                   for batch, length, _ in new_shapes]
        except RuntimeError as error:
            print(f"{name:>9}: not available here ({str(error).splitlines()[0][:120]})")
            continue
        print(f"{name:>9}: one repeated shape (1550, 20) {repeated:7.2f}; 12 new shapes: median "
              f"{statistics.median(new):7.2f}, first {new[0]:7.2f}, max {max(new):7.2f}")
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        attention_call(1549, 21, None)
    chosen = sorted({event.key for event in profiler.key_averages()
                     if "_scaled_dot_product_" in event.key})
    print("the default picks:", ", ".join(chosen) or "?")


def build_objective():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from seq2seq import CONFIG_DIR
    from seq2seq.models.build import build_model
    from seq2seq.ops import KERNELS, speed_up
    from seq2seq.training.loss import SequenceLoss

    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        config = compose("train", overrides=["experiment=multi30k_transformer_gpu"])
    # Every speed kernel but cuda_attention: the rows below choose the attention's backends.
    kernels = [name for name in KERNELS if name != "cuda_attention"]
    model = speed_up(build_model(OmegaConf.to_container(config.model, resolve=True),
                                 src_vocab_size=VOCAB, tgt_vocab_size=VOCAB), kernels).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98),
                                  weight_decay=0.1, fused=True)
    return SequenceLoss(model, label_smoothing=0.1), optimizer


def batch_of(batch: int, source: int, target: int):
    src = torch.randint(4, VOCAB, (batch, source), device=DEVICE)
    lengths = torch.full((batch,), source, device=DEVICE)
    lengths[1::2] = max(1, source * 3 // 4)
    tgt = torch.randint(4, VOCAB, (batch, target + 1), device=DEVICE)
    tgt[1::2, target * 3 // 4:] = 0  # padding
    return src, lengths, tgt[:, :-1], tgt[:, 1:]


def train_step(objective, optimizer, shape) -> None:
    """As Trainer's step: forward and backward under bf16 autocast, clip, check, AdamW."""
    src, lengths, tgt_in, tgt_out = batch_of(*shape)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss, _ = objective(src, lengths, tgt_in, tgt_out)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(objective.parameters(), 1.0)
    if bool(torch.isfinite(norm)):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def probe_steps(objective, optimizer) -> None:
    print("\n== the preset's training step, new (B, S, T) each step (ms, host wall-clock; "
          "median of 30 after 5) ==")
    for max_tokens in (1600, 6400, 25600):
        for name, chosen in (("default attention", contextlib.nullcontext),
                             ("without cuDNN attention", lambda: sdpa_kernel(WITHOUT_CUDNN))):
            times = []
            with chosen():
                for index, shape in enumerate(shapes(max_tokens, 35, seed=max_tokens)):
                    step_ms = wall_ms(lambda s=shape: train_step(objective, optimizer, s))
                    if index >= 5:
                        times.append(step_ms)
                one_shape = (max_tokens // 20, 20, 20)
                repeated = [wall_ms(lambda s=one_shape: train_step(objective, optimizer, s))
                            for _ in range(8)][3:]
            print(f"{max_tokens:>6} tokens, {name:>24}: new shapes {statistics.median(times):7.1f}"
                  f" (max {max(times):7.1f}); one repeated shape {statistics.median(repeated):7.1f}")


def probe_synchronisations(objective, optimizer) -> None:
    print("\n== host synchronisations in one step (torch.cuda.set_sync_debug_mode) ==")
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_step(objective, optimizer, (1280, 20, 20))
    torch.cuda.set_sync_debug_mode("default")
    places = {}
    for warning in caught:
        if "synchroniz" in str(warning.message):
            place = f"{Path(warning.filename).name}:{warning.lineno}"
            places[place] = places.get(place, 0) + 1
    print(", ".join(f"{place} x{count}" for place, count in places.items()) or "none seen")


def probe_profile(objective, optimizer) -> None:
    steps = shapes(25600, 4, seed=7)
    with sdpa_kernel(WITHOUT_CUDNN):
        train_step(objective, optimizer, steps[0])
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
            for shape in steps[1:]:
                train_step(objective, optimizer, shape)
            torch.cuda.synchronize()
    table = profiler.key_averages()
    print("\n== 3 steps at 25,600 tokens without cuDNN attention: by host time ==")
    print(table.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=48))
    print("== by GPU time ==")
    print(table.table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=48))


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("probe_gpu_attention needs a CUDA GPU")
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}, torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
          f"{torch.backends.cudnn.version()}; sdpa enabled: flash "
          f"{torch.backends.cuda.flash_sdp_enabled()}, efficient "
          f"{torch.backends.cuda.mem_efficient_sdp_enabled()}, cudnn "
          f"{torch.backends.cuda.cudnn_sdp_enabled()}, math {torch.backends.cuda.math_sdp_enabled()}")
    torch.manual_seed(0)
    probe_attention()
    objective, optimizer = build_objective()
    probe_steps(objective, optimizer)
    probe_synchronisations(objective, optimizer)
    probe_profile(objective, optimizer)


class _Tee:
    def __init__(self, *streams) -> None:
        self.streams = streams

    def write(self, text: str) -> None:
        for stream in self.streams:
            stream.write(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


if __name__ == "__main__":
    if os.environ.get("OUT"):
        with open(Path(os.environ["OUT"]) / "probe.txt", "w") as copy:
            sys.stdout = _Tee(sys.__stdout__, copy)
            try:
                main()
            finally:
                sys.stdout = sys.__stdout__
    else:
        main()
