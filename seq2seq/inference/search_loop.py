"""The one search loop, :func:`run_search`, and its greedy and beam strategies.

Every search goes through :func:`run_search` (as fairseq's ``search.py``): a small
:class:`Strategy` ranks each step's candidates and the loop does the rest, once for all of
them: the start, the forced tokens (the length limit's EOS, a prefix), finishing hypotheses
and keeping the best live ones, finished sentences leaving the batch, the history.

- :class:`Greedy`: one row per sentence, the most probable token (greedy search), or a
  sampled one (:mod:`seq2seq.inference.sampling`);
- :class:`Beam`: K beams, the 2K best candidates of each sentence;
- the grid of :mod:`seq2seq.inference.constraints`: K beams per bank of constraint pieces.

The loop decodes every row of every sentence in one tensor pass per step: the ``B * R`` rows
are flattened into the batch dimension, the source is encoded once (memory and attention keys)
and its rows are repeated per row (``index_select``; again only when the rows per sentence
change or finished sentences leave the batch), and after each step the decoder state is
reordered to follow the kept rows with :func:`~seq2seq.models.interfaces.select_state` (not
with one row per sentence: it cannot move). Beam search starts from one row per sentence (its
BOS: K copies would give K equal rows) and has K from its first step on; the per-sentence
bookkeeping is one :class:`SearchState` object (``start``, ``advance``, ``prune``).

Conventions shared by every search:

- Decoding starts from ``BOS_ID``; a hypothesis ends at ``EOS_ID``. Returned tokens exclude
  both. ``PAD_ID`` and ``BOS_ID`` are never generated.
- Output length limit: a sentence whose source has ``n`` real positions (its length in
  ``src_lengths``, i.e. padding excluded and the source's own EOS included when the caller
  appended one) gets at most ``floor(max_len_a * n + max_len_b)`` output tokens, **EOS not
  counted**. At that point EOS is forced, so every hypothesis ends with a scored EOS.
- Scores are summed log-probabilities (EOS included), divided by the GNMT length penalty
  ``((5 + length) / 6) ** alpha`` where ``length`` counts the tokens plus the EOS;
  ``alpha = 0`` means no normalisation.
- Every sentence is searched independently of the others in its batch: the bookkeeping of
  finished hypotheses and the stopping decision are per sentence, so a sentence gets the same
  result (up to floating-point noise of batched matrix products) whatever it is batched with.
- Finished sentences leave the batch (a greedy sentence once it produced EOS, a beam-search
  sentence once it is done, by the rules of :func:`run_search`): when the finished ones make
  up at least ``PRUNE_FRACTION`` of the sentences still in the batch, their rows are dropped
  from the decoder state, the encoded source, the previous tokens and every per-sentence
  bookkeeping tensor, so a batch no longer costs as much as its longest translation. Until
  then a finished sentence keeps running and adds nothing. Each step's history holds the rows
  decoded at that step; it is scattered into full-batch ``(T, B, ...)`` tensors and
  backtracked once, at the end (:mod:`seq2seq.inference.search_history`).
- One host synchronisation per step: the number of finished sentences, which decides both
  stopping and pruning. The history stays on the device until the search ends.

The searches call a model through :class:`~seq2seq.models.interfaces.DecodingModel` only (the
PyTorch model, an exported one, an ensemble alike; a shortlist is the loop's ``output_ids``);
they do not switch it to eval mode, call ``model.eval()`` first.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from seq2seq.data.vocab import BOS_ID, EOS_ID
from seq2seq.inference.forcing import forced_tokens, next_token_log_probs
from seq2seq.inference.search_history import SearchHistory
from seq2seq.models.interfaces import DecodingModel, Encoded, select_state


class Hypothesis(NamedTuple):
    """One output of a search.

    Attributes:
        tokens: the output ids, without BOS and EOS.
        score: the length-penalised log-probability used for ranking.
        attention: attention weights when requested, else None. Shape (T_out, S) with
            ``T_out = len(tokens) + 1`` (the last row is the step that produced EOS) and ``S``
            the source's real length (padding excluded).
    """

    tokens: list[int]
    score: float
    attention: Tensor | None


def length_penalty_factor(length: Tensor | float, alpha: float) -> Tensor | float:
    """GNMT length penalty ``((5 + length) / 6) ** alpha``; a score is divided by it."""
    return ((5.0 + length) / 6.0) ** alpha


def max_output_lengths(src_lengths: Tensor, *, max_len_a: float, max_len_b: float) -> Tensor:
    """Per-sentence limit on output tokens (EOS not counted): ``floor(a * n + b)``, at least 0.

    Shape:
        - src_lengths: (B,); output: (B,) int64, on the device of ``src_lengths``
    """
    limits = torch.floor(max_len_a * src_lengths.double() + max_len_b).long()
    return limits.clamp(min=0)


# Finished sentences leave the batch once they make up this fraction of those still in it (and
# at least one): pruning copies the encoded source and the state, so it waits for a few
# sentences to leave together.
PRUNE_FRACTION = 0.125


def prune_now(finished: int, active: int) -> bool:
    """Whether ``finished`` of the ``active`` sentences still in the batch should leave now."""
    return finished > 0 and finished >= PRUNE_FRACTION * active


def kept_rows(finished: Tensor, count: int) -> Tensor:
    """Indices of the ``count`` unfinished rows, ascending, without a host sync.

    Shape:
        - finished: (N,) bool, with exactly ``N - count`` True
        - output: (count,) int64
    """
    rows = torch.arange(finished.numel(), device=finished.device)  # (N,)
    return rows.masked_fill(finished, finished.numel()).sort().values[:count]


def in_autocast_dtype(encoded: Encoded, device_type: str) -> Encoded:
    """Under autocast on ``device_type``, the encoded source with its memory in the autocast
    dtype (cast once per batch rather than at every step's products); unchanged otherwise."""
    if not torch.is_autocast_enabled(device_type):
        return encoded
    return encoded.cast_memory(torch.get_autocast_dtype(device_type))


def top_candidates(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` best (score, index) of each row; -inf (index 0) fills in where a row has fewer
    than ``k`` entries (a tiny vocabulary at the first step).

    Shape:
        - scores: (N, C); output: (N, k) each
    """
    values, index = scores.topk(min(k, scores.size(1)), dim=1)
    missing = k - values.size(1)
    if missing > 0:
        values = torch.cat([values, values.new_full((values.size(0), missing), -math.inf)], 1)
        index = torch.cat([index, index.new_zeros(index.size(0), missing)], 1)
    return values, index


class Step(NamedTuple):
    """What a :class:`Strategy` makes of a step's candidates, per sentence still in the batch (N
    of them): the EOS candidates that may finish a hypothesis, and the rows to continue with.

    Attributes:
        finish_scores: (N, K) summed log-probabilities of the EOS candidates that may finish a
            hypothesis now (-inf: none); K is the strategy's ``beam_size``.
        finish_parents: (N, K) the row (0..R-1, of the rows just decoded) each extends.
        scores: (N, R') the next rows' summed log-probabilities (-inf: an empty row).
        parents: (N, R') the row each next row extends.
        tokens: (N, R') the token each adds.
    """

    finish_scores: Tensor
    finish_parents: Tensor
    scores: Tensor
    parents: Tensor
    tokens: Tensor


def split_ranked(scores: Tensor, parents: Tensor, tokens: Tensor,
                 k: int) -> tuple[Step, Tensor | None]:
    """Ranked candidates, best first, split as beam search splits them: the EOS candidates among
    the first ``k`` may finish a hypothesis, the ``k`` best others continue (C = k: every
    candidate, in place, an EOS one as an empty -inf row). Also returns which candidates
    continue (their ranks, (..., k); None where C = k).

    Shape:
        - scores, parents, tokens: (..., C), C >= k; the :class:`Step`'s fields: (..., k)
    """
    is_eos = tokens == EOS_ID
    finish_scores = scores[..., :k].masked_fill(~is_eos[..., :k], -math.inf)
    finish_parents = parents[..., :k]
    live_scores, rank = scores.masked_fill(is_eos, -math.inf), None
    if scores.size(-1) > k:
        live_scores, rank = live_scores.topk(k, dim=-1)
        parents, tokens = parents.gather(-1, rank), tokens.gather(-1, rank)
    return Step(finish_scores, finish_parents, live_scores, parents, tokens), rank


class Strategy:
    """How a search picks each step's candidates; :func:`run_search` does the rest.

    Attributes:
        beam_size: K, the hypotheses each sentence finishes at most (and a beam keeps).
        start_rows: rows per sentence at the first step, row 0 the BOS, the others empty.
        required_tokens: (B,) tokens each output must hold beside its prefix (the grid: its
            constraint pieces), so that its length limit holds them; None: none.
    """

    beam_size: int = 1
    start_rows: int = 1
    required_tokens: Tensor | None = None

    def candidates(self, log_probs: Tensor, scores: Tensor) -> Step:
        """The step's finishing candidates and next rows; called once a step, so a strategy
        that keeps per-row state (the grid's phrases) moves it to the next rows here.

        Shape:
            - log_probs: (N, R, V) the next token's log-probabilities (forcing applied)
            - scores: (N, R) each row's summed log-probability (-inf: an empty row)
        """
        raise NotImplementedError

    def prune(self, keep: Tensor) -> None:
        """Only the sentences ``keep`` (N',) stay in the batch."""


class Greedy(Strategy):
    """One hypothesis per sentence, extended by the most probable next token or by the one
    ``choose`` picks (log-probabilities (N, V) -> tokens (N,); :mod:`seq2seq.inference.sampling`
    samples it): greedy search."""

    def __init__(self, choose: Callable[[Tensor], Tensor] | None = None) -> None:
        self.choose = choose
        self.row_zero: Tensor | None = None  # (1, 1) every row's parent, made once

    def candidates(self, log_probs: Tensor, scores: Tensor) -> Step:
        log_probs = log_probs.squeeze(1)  # (N, V): one row per sentence
        if self.choose is None:
            chosen_log_probs, tokens = log_probs.max(dim=-1)  # (N,), (N,)
        else:
            tokens = self.choose(log_probs)  # (N,)
            chosen_log_probs = log_probs.gather(1, tokens.unsqueeze(1)).squeeze(1)
        tokens = tokens.view(-1, 1)
        if self.row_zero is None:
            self.row_zero = tokens.new_zeros(1, 1)
        summed = (scores.squeeze(1) + chosen_log_probs).view(-1, 1)  # (N, 1)
        step, _ = split_ranked(summed, self.row_zero.expand_as(tokens), tokens, 1)
        return step


class Beam(Strategy):
    """Beam search: each sentence's ``2 K`` best (row, next token) candidates by summed
    log-probability, split as :func:`run_search` describes."""

    def __init__(self, beam_size: int) -> None:
        self.beam_size = beam_size

    def candidates(self, log_probs: Tensor, scores: Tensor) -> Step:
        active, rows, vocab_size = log_probs.shape
        candidates = log_probs.add_(scores.unsqueeze(2)).view(active, rows * vocab_size)
        top_scores, top_index = top_candidates(candidates, 2 * self.beam_size)  # (N, 2K)
        step, _ = split_ranked(top_scores, top_index // vocab_size, top_index % vocab_size,
                               self.beam_size)
        return step


class SearchState(NamedTuple):
    """The sentences a search still decodes, one row each (N of them, N shrinking from B as
    sentences leave), with their hypotheses' and finished hypotheses' bookkeeping.

    Attributes:
        sentences: (N,) each row's sentence in the batch.
        tokens: (N, R) the last token of each live hypothesis (BOS at the start).
        scores: (N, R) each live hypothesis' summed log-probability (-inf: a dead or empty row).
        done: (N,) bool, the sentence adds no more finished hypotheses.
        finished_count: (N,) its finished hypotheses so far.
        best_finished: (N, nbest) the best of their scores, best first (-inf: none).
        max_lengths: (N,) its output limit (EOS not counted).
        max_length_penalty: (N,) the length penalty at that limit.
        length_penalty: the GNMT alpha (the same for every row).
    """

    sentences: Tensor
    tokens: Tensor
    scores: Tensor
    done: Tensor
    finished_count: Tensor
    best_finished: Tensor
    max_lengths: Tensor
    max_length_penalty: Tensor
    length_penalty: float

    @classmethod
    def start(cls, max_lengths: Tensor, *, rows: int, length_penalty: float, nbest: int) -> SearchState:
        """Every sentence of the batch with ``rows`` rows, row 0 live (BOS, score 0)."""
        batch_size, device = max_lengths.numel(), max_lengths.device
        scores = torch.full((batch_size, rows), -math.inf, device=device)
        scores[:, 0] = 0.0
        return cls(
            sentences=torch.arange(batch_size, device=device),
            tokens=torch.full((batch_size, rows), BOS_ID, dtype=torch.long, device=device),
            scores=scores,
            done=torch.zeros(batch_size, dtype=torch.bool, device=device),
            finished_count=torch.zeros(batch_size, dtype=torch.long, device=device),
            best_finished=torch.full((batch_size, nbest), -math.inf, device=device),
            max_lengths=max_lengths,
            max_length_penalty=length_penalty_factor(max_lengths.float() + 1.0, length_penalty),
            length_penalty=length_penalty,
        )

    def advance(self, step: int, *, finalize: Tensor, scores: Tensor, live_scores: Tensor,
                tokens: Tensor, beam_size: int, limit_reached: bool) -> SearchState:
        """After ``step``: the hypotheses ``finalize`` finished with ``scores`` (N, K), the live
        rows' new ``tokens`` and ``live_scores`` (N, R), and which sentences are done now (see
        :func:`run_search` for the rules and the bound); ``limit_reached``: whether some
        sentence may be at its length limit (else the search skips that comparison)."""
        finished_count = self.finished_count + finalize.sum(dim=1)
        done = self.done | (finished_count >= beam_size)
        if limit_reached:
            done = done | (self.max_lengths <= step)
        best_finished = self.best_finished
        nbest = best_finished.size(1)
        if nbest < beam_size:  # with nbest = K, K finished hypotheses end a sentence first
            best_finished = torch.cat([best_finished, scores], dim=1).topk(nbest, dim=1).values
            next_penalty = length_penalty_factor(step + 2.0, self.length_penalty)
            bound = live_scores.max(dim=1).values / torch.clamp(self.max_length_penalty,
                                                                 min=next_penalty)
            done = done | ((finished_count >= nbest) & (bound <= best_finished[:, -1]))
        return self._replace(tokens=tokens, scores=live_scores, done=done,
                             finished_count=finished_count, best_finished=best_finished)

    def prune(self, keep: Tensor) -> SearchState:
        """Only the rows ``keep`` (N',): the sentences that stay in the batch."""
        return SearchState(*(t[keep] for t in self[:-1]), self.length_penalty)


def rows_per_sentence(encoded: Encoded, sentences: int, rows: int, device) -> Encoded:
    """The encoded source of ``sentences`` sentences with each one's row repeated ``rows``
    times (a copy, unless ``rows`` is 1)."""
    if rows == 1:
        return encoded
    return encoded.index_select(torch.arange(sentences, device=device).repeat_interleave(rows))


@torch.inference_mode()
def run_search(
    model: DecodingModel,
    src: Tensor,
    src_lengths: Tensor,
    strategy: Strategy,
    *,
    max_len_a: float,
    max_len_b: float,
    length_penalty: float = 1.0,
    nbest: int = 1,
    return_attention: bool = False,
    prefixes: Tensor | None = None,
    output_ids: Tensor | None = None,
) -> list[list[Hypothesis]]:
    """The one search loop: ``strategy`` ranks each step's candidates, the rest is here.

    Each step decodes the N * R rows in one pass, forces a token where the length limit or a
    prefix says so (:func:`~seq2seq.inference.forcing.forced_tokens`), and asks the strategy
    for the EOS candidates that may finish a hypothesis (scored here with the length penalty)
    and the next rows, which the decoder state follows. With :class:`Beam` and beam size K,
    EOS candidates among a sentence's ``2 K`` best finish if they rank in the first ``K``, and
    the ``K`` best others are the next beam (``2 K`` holds ``K`` of them).

    A sentence is done, and adds no more finished hypotheses, when any of these holds:

    - it has ``K`` finished hypotheses (so beam size 1 is exactly greedy search);
    - it has ``nbest`` finished hypotheses and no live row can beat the ``nbest``-th of
      them even at the longest allowed length (the summed log-probability only decreases, so
      ``best live sum / max(lp(next length), lp(max length))`` bounds every continuation);
    - its output length limit was reached (EOS was forced on every row).

    The search stops when every sentence is done; a done sentence leaves the batch (the module
    docstring). The batch holds at least one sentence (a translator never searches an empty
    one).

    Args:
        model: in eval mode.
        src: (B, S) source ids, padded with PAD_ID.
        src_lengths: (B,) real source lengths (best on the CPU: the limits are read there).
        max_len_a, max_len_b: the output length limit (the module docstring).
        length_penalty: GNMT alpha; 0 ranks by summed log-probability (with :class:`Greedy`
            it changes the reported score only).
        nbest: hypotheses returned per sentence (at most the strategy's ``beam_size``).
        prefixes: (B, P) each sentence's forced first output tokens, -1 after its prefix (see
            :func:`~seq2seq.inference.forcing.pad_prefixes`); None: none.
        output_ids: (V',) ascending target ids, the special ones first (a shortlist,
            :mod:`seq2seq.inference.shortlist`): the model scores only these and the search
            runs over their positions 0..V'-1 (``prefixes`` too), mapped back to target ids in
            the hypotheses returned; None: the whole vocabulary.

    Returns:
        Per sentence, in input order, up to ``nbest`` distinct hypotheses, best first. Fewer
        than ``nbest`` only happens when the length limit or a tiny vocabulary leaves fewer
        live rows.
    """
    batch_size, source_len = src.shape  # B >= 1: a translator batches non-empty sources
    K, device = strategy.beam_size, src.device
    encoded = in_autocast_dtype(model.encode(src, src_lengths), device.type)
    # On src_lengths' device (the CPU from a Translator), so that reading the limits below
    # waits for nothing on the model's device; they move there after.
    max_lengths = max_output_lengths(src_lengths, max_len_a=max_len_a, max_len_b=max_len_b)
    needed = strategy.required_tokens  # the limit grows to hold these and the prefix
    if prefixes is not None:
        prefix_lengths = (prefixes >= 0).sum(dim=1)
        needed = prefix_lengths if needed is None else needed + prefix_lengths.to(needed.device)
    if needed is not None:
        max_lengths = torch.maximum(max_lengths, needed.to(max_lengths.device))
    max_steps = int(max_lengths.max()) + 1  # + 1 for the EOS step
    first_forced_step = int(max_lengths.min())
    max_lengths = max_lengths.to(device)
    # A model is asked for output_ids only with a shortlist (a DecodingModel of its own may
    # predate the argument).
    step_options = {} if output_ids is None else {"output_ids": output_ids}

    beams = SearchState.start(max_lengths, rows=strategy.start_rows, length_penalty=length_penalty,
                        nbest=nbest)
    row_encoded = rows_per_sentence(encoded, batch_size, strategy.start_rows, device)
    state = model.init_state(row_encoded)
    history = SearchHistory(beams.sentences, attention=return_attention)
    for step in range(max_steps):
        active, rows = beams.scores.shape  # N sentences, R rows each
        previous = beams.tokens.reshape(-1)  # (N*R,)
        if output_ids is not None:  # positions in the shortlist -> target ids
            previous = output_ids.index_select(0, previous)
        logits, weights, state = model.decode_step(  # (N*R, V), (N*R, S)
            previous, state, row_encoded, **step_options)
        forced = forced_tokens(step, beams.max_lengths, first_forced_step, prefixes,
                               beams.sentences)  # (N,) or None
        if forced is not None and rows > 1:
            forced = forced.repeat_interleave(rows)  # (N*R,)
        log_probs = next_token_log_probs(logits, forced).view(active, rows, -1)  # (N, R, V)
        found = strategy.candidates(log_probs, beams.scores)
        # Finish the EOS candidates of sentences still searching (-inf: no candidate).
        finalize = (found.finish_scores > -math.inf) & ~beams.done.unsqueeze(1)  # (N, K)
        final_scores = torch.where(  # (N, K)
            finalize, found.finish_scores / length_penalty_factor(step + 1.0, length_penalty),
            -math.inf)
        live_scores, parents, tokens = found.scores, found.parents, found.tokens  # (N, R') each
        new_rows = tokens.size(1)
        if return_attention:  # (N, R', S): a beam search's first row is every beam's
            weights = weights.float().view(active, rows, source_len)
            weights = weights.expand(active, new_rows, source_len)
        history.record(tokens=tokens, parents=parents, weights=weights,
                       final_scores=final_scores, final_parents=found.finish_parents)
        beams = beams.advance(step, finalize=finalize, scores=final_scores,
                              live_scores=live_scores, tokens=tokens, beam_size=K,
                              limit_reached=step >= first_forced_step)
        done_count = int(beams.done.sum())  # the one host sync per step
        if done_count == active:
            break
        pruned = prune_now(done_count, active)
        if pruned:
            keep = kept_rows(beams.done, active - done_count)  # (N',)
            beams = beams.prune(keep)
            strategy.prune(keep)
            encoded = encoded.index_select(keep)
            history.leave(step + 1, beams.sentences)
        if rows == new_rows == 1:  # one row per sentence stays where it is
            if pruned:
                state = select_state(state, keep)
        else:  # follow the rows (and prune) at once: the row each continues, of N*R
            state_rows = (torch.arange(active, device=device) * rows).unsqueeze(1) + parents
            state = select_state(state, (state_rows[keep] if pruned else state_rows).view(-1))
        if pruned or rows != new_rows:
            row_encoded = rows_per_sentence(encoded, beams.sentences.numel(), new_rows, device)

    found = history.hypotheses(src_lengths, nbest, output_ids=output_ids)
    return [[Hypothesis(*hypothesis) for hypothesis in n_best] for n_best in found]
