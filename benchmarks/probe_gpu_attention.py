"""Where a GPU training step of ``experiment=multi30k_transformer_gpu`` goes (CUDA only).

    python -m benchmarks.probe_gpu_attention

The GPU check of 2026-11-28 (docs/results.md#gpu-check) found the step at about 190 ms, 0.5 %
of an H200's bf16 ceiling, with ``scaled_dot_product_attention`` holding the Python thread
10.5 ms a call. This times that call forward and backward at the preset's shapes with a boolean
key mask (as the model passes it), an additive float mask, no mask and a causal mask, then one
step of the preset's model on random tokens, and prints the profiler's kernels by GPU time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

BATCH, HEADS, LENGTH, HEAD_DIM = 1550, 4, 20, 64  # a 25,600-token batch of Multi30k


def milliseconds(function, repeats: int = 20) -> float:
    """Mean CUDA time of ``function`` after three warm-ups."""
    for _ in range(3):
        function()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        function()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def main() -> None:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from seq2seq import CONFIG_DIR
    from seq2seq.models.build import build_model
    from seq2seq.training.loss import SequenceLoss

    device = "cuda"
    q, k, v = (torch.randn(BATCH, HEADS, LENGTH, HEAD_DIM, device=device, dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    keys = torch.ones(BATCH, LENGTH, dtype=torch.bool, device=device)
    keys[1::2, 15:] = False  # every other sentence shorter
    additive = torch.zeros(BATCH, 1, 1, LENGTH, device=device, dtype=torch.bfloat16)
    additive.masked_fill_(~keys[:, None, None, :], float("-inf"))
    for name, options in (("boolean key mask, dropout 0.1", {"attn_mask": keys[:, None, None, :],
                                                             "dropout_p": 0.1}),
                          ("additive float mask, dropout 0.1", {"attn_mask": additive,
                                                                "dropout_p": 0.1}),
                          ("no mask, dropout 0.1", {"dropout_p": 0.1}),
                          ("causal, dropout 0.1", {"is_causal": True, "dropout_p": 0.1})):
        time = milliseconds(lambda o=options: F.scaled_dot_product_attention(q, k, v, **o)
                            .sum().backward())
        print(f"attention forward + backward, {name}: {time:.2f} ms")

    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        config = compose("train", overrides=["experiment=multi30k_transformer_gpu"])
    model = build_model(OmegaConf.to_container(config.model, resolve=True), src_vocab_size=8000,
                        tgt_vocab_size=8000).to(device)
    objective = SequenceLoss(model, label_smoothing=0.1)
    src = torch.randint(4, 8000, (BATCH, LENGTH), device=device)
    lengths = torch.full((BATCH,), LENGTH, device=device)
    lengths[1::2] = 15
    tgt = torch.randint(4, 8000, (BATCH, LENGTH + 1), device=device)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, _ = objective(src, lengths, tgt, tgt)
        loss.backward()

    print(f"the preset's forward + backward: {milliseconds(step, 10):.1f} ms")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    print(profiler.key_averages().table(sort_by="cuda_time_total", row_limit=18))


if __name__ == "__main__":
    main()
