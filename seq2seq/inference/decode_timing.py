"""``precision=auto``'s workload for decoding: the model's own greedy search of a batch.

:func:`decoding_workload` gives :func:`seq2seq.precision.choose_cpu_precision` a greedy search
(encoder, every decoder step, output layer) of a fixed batch of made-up sources, in fp32 and
under bf16 autocast alternately: what translate, evaluate and serve decide for. The search is
seeded by nothing and changes nothing in the model.
"""

from __future__ import annotations

import torch

from seq2seq import precision
from seq2seq.data.vocab import EOS_ID
from seq2seq.inference.search_loop import Greedy, run_search

SENTENCES, SOURCE_PIECES = 64, 16  # about a Multi30k batch's sentences and length
FIRST_ID = 4                       # after the special pieces (pad, unk, bos, eos)


def decoding_workload(model, *, source_vocab_size: int, device: torch.device) -> precision.Workload:
    """The module docstring's workload, for ``model``: ``SENTENCES`` sources of ``SOURCE_PIECES``
    pieces (ids drawn once from a fixed seed), up to as many output pieces."""
    name = (f"greedy search of {precision.model_description(model)}, {SENTENCES} sources of "
            f"{SOURCE_PIECES} pieces")

    def measure():
        generator = torch.Generator().manual_seed(0)
        src = torch.randint(FIRST_ID, max(source_vocab_size, FIRST_ID + 1),
                            (SENTENCES, SOURCE_PIECES), generator=generator)
        src[:, -1] = EOS_ID
        src = src.to(device)
        lengths = torch.full((SENTENCES,), SOURCE_PIECES)

        def repetition(dtype: torch.dtype | None, _pair: int) -> None:
            with torch.inference_mode(), precision.autocast(device.type, dtype):
                run_search(model, src, lengths, Greedy(), max_len_a=0.0,
                           max_len_b=SOURCE_PIECES)

        return precision.time_alternately(repetition, repeats=precision.STEP_REPEATS,
                                          budget_s=precision.STEP_BUDGET_S)

    return precision.Workload(name, measure)
