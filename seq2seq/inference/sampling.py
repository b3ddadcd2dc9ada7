"""Sampling instead of searching: translations drawn from the model's own distribution.

Back-translation learns more from sampled synthetic sources than from beam search's (Edunov et
al., 2018: sampling keeps the variety of real text that the most probable output loses). Each
step draws the next piece from the model's distribution, reshaped by the options (in this
order):

- ``temperature`` T: log-probabilities divided by T (below 1 sharper, above 1 flatter);
- ``top_k``: only the k most probable pieces (0: all of them); ``top_k=1`` is greedy search;
- ``epsilon``: only pieces of probability at least epsilon (Hewitt et al., 2022), the most
  probable always kept;
- ``top_p``: only the smallest set of most probable pieces whose probability reaches p
  (nucleus sampling, Holtzman et al., 2020); 1 keeps all.

A sentence gets ``nbest`` independent samples, best score first. The score is the model's own
length-penalised log-probability of the sample (not the reshaped one), as the searches report.
The draws come from one ``torch.Generator``: a seed makes a run reproducible for the same input
and batch settings. Everything else (length limits, forced prefixes, finished sentences leaving
the batch, every runtime) is the one search loop's,
:func:`~seq2seq.inference.search_loop.run_search`, with greedy search's strategy
(:class:`~seq2seq.inference.search_loop.Greedy`) given another choice of the next token.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from seq2seq.inference.search_loop import Greedy, Hypothesis, run_search
from seq2seq.models.interfaces import DecodingModel


def probabilities(log_probs: Tensor, options) -> Tensor:
    """The next-piece probabilities reshaped by ``options`` (a
    :class:`~seq2seq.inference.decode_options.DecodeOptions`: its temperature, top_k, epsilon
    and top_p), unnormalised (zeros where a filter drops).

    Shape:
        - log_probs: (N, V), -inf where a piece is forbidden; output: (N, V)
    """
    probs = torch.softmax(log_probs / options.temperature, dim=-1)  # (N, V)
    if 0 < options.top_k < probs.size(-1):
        kth = probs.topk(options.top_k, dim=-1).values[:, -1:]  # (N, 1)
        probs = probs.masked_fill(probs < kth, 0.0)
    if options.epsilon > 0:
        most_probable = probs.argmax(dim=-1, keepdim=True)  # (N, 1)
        dropped = (probs < options.epsilon).scatter(1, most_probable, False)
        probs = probs.masked_fill(dropped, 0.0)
    if options.top_p < 1:
        probs = probs / probs.sum(dim=-1, keepdim=True)
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Drop a piece once the more probable ones before it already reach top_p.
        dropped_sorted = sorted_probs.cumsum(dim=-1) - sorted_probs >= options.top_p
        dropped_sorted[:, 0] = False
        probs = probs.masked_fill(dropped_sorted.scatter(1, order, dropped_sorted), 0.0)
    return probs


def chooser(options, generator: torch.Generator | None) -> Callable[[Tensor], Tensor]:
    """log-probabilities (N, V) -> one piece per row (N,), drawn from ``generator`` with
    ``options``' :func:`probabilities`."""

    def choose(log_probs: Tensor) -> Tensor:
        return torch.multinomial(probabilities(log_probs, options), 1,
                                 generator=generator).squeeze(1)

    return choose


@torch.inference_mode()
def sample_search(
    model: DecodingModel,
    src: Tensor,
    src_lengths: Tensor,
    options,
    *,
    generator: torch.Generator | None = None,
    prefixes: Tensor | None = None,
    **settings,
) -> list[list[Hypothesis]]:
    """Per sentence, in input order, ``options.nbest`` independent samples (duplicates
    possible), best score first, drawn from ``generator`` (None: PyTorch's global one);
    ``prefixes`` and ``settings`` are :func:`~seq2seq.inference.search_loop.run_search`'s."""
    batch_size, nbest = src.size(0), options.nbest
    copies = torch.arange(batch_size).repeat_interleave(nbest)  # each sentence nbest times
    samples = run_search(
        model, src[copies.to(src.device)], src_lengths[copies.to(src_lengths.device)],
        Greedy(chooser(options, generator)),
        prefixes=None if prefixes is None else prefixes[copies.to(prefixes.device)], **settings)
    results = []
    for sentence in range(batch_size):
        drawn = [n_best[0] for n_best in samples[sentence * nbest: (sentence + 1) * nbest]]
        results.append(sorted(drawn, key=lambda hypothesis: -hypothesis.score))  # stable
    return results
