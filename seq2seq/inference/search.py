"""Greedy and beam search over a batch of source sentences.

Both searches decode every sentence of a batch (and, for beam search, every beam of every
sentence) in one tensor pass per step: the ``B * K`` hypotheses are flattened into the batch
dimension, the source is encoded once (memory and attention keys) and its rows are repeated
per beam (``index_select``; again only when finished sentences leave the batch), and after each
step the decoder state is reordered to follow the surviving beams with
:func:`~seq2seq.models.interfaces.select_state`. Beam search starts from one row per sentence
(its BOS: K copies would give K equal rows) and has K from its first step on; its per-sentence
bookkeeping is one :class:`Beams` object (``start``, ``advance``, ``prune``).

Conventions shared by both searches:

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
  sentence once it is done): when the finished ones make up at least ``PRUNE_FRACTION`` of
  the sentences still in the batch, their rows are dropped from the decoder state, the
  encoded source, the previous tokens and every per-sentence bookkeeping tensor, so a batch no
  longer costs as much as its longest translation. Until then a finished sentence keeps
  running, masked, and adds nothing. Each step's history holds the rows decoded at that step;
  it is scattered into full-batch ``(T, B, ...)`` tensors once, at the end
  (:mod:`seq2seq.inference.search_history`).
- One host synchronisation per step: the number of finished sentences, which decides both
  stopping and pruning. The history stays on the device until the search ends.

The searches call a model through :class:`~seq2seq.models.interfaces.DecodingModel` only (the
PyTorch model, an exported one, an ensemble, a shortlisted one alike); they do not switch it to
eval mode, call ``model.eval()`` first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from seq2seq.data.vocab import BOS_ID, EOS_ID, PAD_ID
from seq2seq.inference.search_history import collect_hypotheses, full_history, history_index
from seq2seq.models.interfaces import DecodingModel, Encoded, State, select_state


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
        - src_lengths: (B,)
        - output: (B,) int64, on the device of ``src_lengths``
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


class SearchStart(NamedTuple):
    """What both searches set up first: the encoded source (one row per sentence), the decoder
    state, and the output length limits.

    Attributes:
        encoded: the model's encoded source, in the autocast dtype under autocast.
        state: the decoder's initial state, one row per sentence.
        max_lengths: (B,) each sentence's output limit (EOS not counted), on the device.
        max_steps: steps the longest limit allows (its EOS step included).
        first_forced_step: the first step at which some sentence is forced to end.
    """

    encoded: Encoded
    state: State
    max_lengths: Tensor
    max_steps: int
    first_forced_step: int


def start_search(model: DecodingModel, src: Tensor, src_lengths: Tensor, *, max_len_a: float,
                 max_len_b: float, prefixes: Tensor | None = None) -> SearchStart:
    """Encode the batch once and compute its length limits (see the module docstring); a
    forced prefix longer than its sentence's limit raises the limit to its length."""
    encoded = in_autocast_dtype(model.encode(src, src_lengths), src.device.type)
    max_lengths = max_output_lengths(src_lengths, max_len_a=max_len_a, max_len_b=max_len_b)
    if prefixes is not None:
        max_lengths = torch.maximum(max_lengths, (prefixes >= 0).sum(dim=1).to(max_lengths))
    return SearchStart(
        encoded=encoded,
        state=model.init_state(encoded),
        max_lengths=max_lengths.to(src.device),
        max_steps=int(max_lengths.max()) + 1,  # + 1 for the EOS step
        first_forced_step=int(max_lengths.min()),
    )


def next_token_log_probs(logits: Tensor, forced: Tensor | None) -> Tensor:
    """Log-probabilities of the next token, with PAD/BOS forbidden and a token forced where asked.

    Forbidden tokens get -inf after the softmax: the others keep their log-probabilities (a
    forced token keeps its own, so a score stays the model's).

    Shape:
        - logits: (N, V)
        - forced: (N,) the token each row must produce, -1 where any may follow; None when no
          row is forced
        - output: (N, V) float32
    """
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
    log_probs[:, PAD_ID] = -math.inf
    log_probs[:, BOS_ID] = -math.inf
    if forced is None:
        return log_probs
    # In place, no (N, V) temporaries: this runs over the whole output layer at every step.
    is_forced = (forced >= 0).unsqueeze(1)  # (N, 1)
    column = forced.clamp(min=0).masked_fill(~is_forced.squeeze(1), PAD_ID).unsqueeze(1)
    kept = log_probs.gather(1, column)  # (N, 1); -inf (PAD's) in a free row
    log_probs.masked_fill_(is_forced, -math.inf)
    return log_probs.scatter_(1, column, kept)


def forced_tokens(step: int, max_lengths: Tensor, first_forced_step: int,
                  prefixes: Tensor | None, sentences: Tensor) -> Tensor | None:
    """Per sentence, the token ``step`` must produce (-1: any), or None when none is forced:
    EOS at the length limit, else a forced prefix's token.

    ``first_forced_step`` is the smallest limit of the batch, known on the host: until then and
    past the prefixes no row is forced and the search skips a masking pass over the whole
    (N, V) output layer.

    Shape:
        - max_lengths, sentences: (N,) the limits and batch rows of the sentences in the batch
        - prefixes: (B, P) each sentence's forced first tokens, -1 after its prefix; or None
        - output: (N,) int64, or None
    """
    forced = None
    if prefixes is not None and step < prefixes.size(1):
        forced = prefixes[sentences, step]  # (N,)
    if step >= first_forced_step:
        free = torch.full_like(max_lengths, -1) if forced is None else forced
        forced = torch.where(max_lengths <= step, EOS_ID, free)
    return forced


@torch.inference_mode()
def greedy_search(
    model,
    src: Tensor,
    src_lengths: Tensor,
    *,
    max_len_a: float,
    max_len_b: float,
    return_attention: bool = False,
    length_penalty: float = 1.0,
    prefixes: Tensor | None = None,
    choose: Callable[[Tensor], Tensor] | None = None,
) -> list[list[Hypothesis]]:
    """Decode a batch by always taking the most probable next token (or the one ``choose``
    picks: :mod:`seq2seq.inference.sampling` samples it).

    Args:
        model: a :class:`DecodingModel` (e.g. a :class:`~seq2seq.models.seq2seq.Seq2Seq`),
            in eval mode.
        src: source ids, padded with PAD_ID.
        src_lengths: real source lengths, best on the CPU (the length limits are read there).
        max_len_a: output length limit ``floor(a * source length + b)`` (EOS not counted).
        max_len_b: see ``max_len_a``.
        return_attention: also return each hypothesis' attention weights.
        length_penalty: GNMT alpha used for the reported score only (it cannot change a
            greedy output); the default matches :func:`beam_search`, so that beam size 1
            reports the same scores.
        prefixes: (B, P) each sentence's forced first output tokens, -1 after its prefix (see
            :func:`pad_prefixes`); None: none.
        choose: log-probabilities (N, V) -> the next tokens (N,); None: the most probable.

    Returns:
        One single-element list of :class:`Hypothesis` per sentence, in input order.

    Shape:
        - src: (B, S) int64
        - src_lengths: (B,) int64
    """
    batch_size = src.size(0)
    if batch_size == 0:
        return []
    device = src.device
    encoded, state, max_lengths, max_steps, first_forced_step = start_search(
        model, src, src_lengths, max_len_a=max_len_a, max_len_b=max_len_b, prefixes=prefixes)

    # Row i of every (N, ...) tensor is sentence `sentences[i]` of the batch; N shrinks from B
    # as finished sentences leave (the encoded source and the state follow the same rows).
    sentences = torch.arange(batch_size, device=device)  # (N,)
    segments = [(0, sentences)]  # (first step, sentences decoded from then on)
    prev_tokens = torch.full((batch_size,), BOS_ID, dtype=torch.long, device=device)  # (N,)
    finished = torch.zeros(batch_size, dtype=torch.bool, device=device)  # (N,)
    log_prob_sums = torch.zeros(batch_size, device=device)  # (B,) by sentence, never pruned
    step_tokens: list[Tensor] = []  # each (N,), the sentences decoded at that step
    step_weights: list[Tensor] = []  # each (N, S)
    for step in range(max_steps):
        logits, weights, state = model.decode_step(prev_tokens, state, encoded)  # (N, V), (N, S)
        forced = forced_tokens(step, max_lengths, first_forced_step, prefixes, sentences)
        log_probs = next_token_log_probs(logits, forced)  # (N, V)
        if choose is None:
            best_log_probs, tokens = log_probs.max(dim=-1)  # (N,), (N,)
        else:
            tokens = choose(log_probs)  # (N,)
            best_log_probs = log_probs.gather(1, tokens.unsqueeze(1)).squeeze(1)
        # Finished sentences not pruned yet keep running but add nothing.
        tokens = tokens.masked_fill(finished, PAD_ID)
        log_prob_sums.index_add_(0, sentences, best_log_probs.masked_fill(finished, 0.0))
        finished = finished | (tokens == EOS_ID)
        step_tokens.append(tokens)
        if return_attention:
            step_weights.append(weights.float())
        prev_tokens = tokens
        active = sentences.numel()
        finished_count = int(finished.sum())  # the one host sync per step
        if finished_count == active:
            break
        if prune_now(finished_count, active):
            keep = kept_rows(finished, active - finished_count)  # (N',)
            kept = [t[keep] for t in (sentences, prev_tokens, max_lengths, finished)]
            sentences, prev_tokens, max_lengths, finished = kept
            encoded = encoded.index_select(keep)
            state = select_state(state, keep)
            segments.append((step + 1, sentences))

    index = history_index(segments, len(step_tokens), batch_size)
    all_tokens = full_history(step_tokens, index, batch_size, PAD_ID).cpu()  # (T, B)
    all_weights = None  # (T, B, S)
    if return_attention:
        all_weights = full_history(step_weights, index, batch_size, 0.0).cpu()
    log_prob_sums = log_prob_sums.cpu()
    results = []
    for sentence in range(batch_size):
        row = all_tokens[:, sentence].tolist()
        length = row.index(EOS_ID)  # always present: EOS is forced at the length limit
        # Divided as a float32 tensor by a Python float, exactly like beam_search's scores.
        score = float(log_prob_sums[sentence] / length_penalty_factor(length + 1.0, length_penalty))
        attention = None
        if all_weights is not None:
            source_len = int(src_lengths[sentence])
            attention = all_weights[: length + 1, sentence, :source_len].clone()
        results.append([Hypothesis(tokens=row[:length], score=score, attention=attention)])
    return results


def pad_prefixes(prefixes: Sequence[Sequence[int]], device: torch.device | str) -> Tensor | None:
    """Each sentence's forced prefix as one (B, P) tensor, -1 after its end; None when every
    prefix is empty."""
    width = max((len(prefix) for prefix in prefixes), default=0)
    if width == 0:
        return None
    padded = torch.full((len(prefixes), width), -1, dtype=torch.long)
    for row, prefix in enumerate(prefixes):
        padded[row, : len(prefix)] = torch.as_tensor(list(prefix), dtype=torch.long)
    return padded.to(device)


def check_beam_options(beam_size: int, nbest: int) -> None:
    """A one-line ValueError unless ``beam_size >= 1`` and ``nbest`` is in ``1..beam_size``."""
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest must be between 1 and beam_size ({beam_size}), got {nbest}")


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


def finish_step(beams, step: int, *, finalize: Tensor, scores: Tensor, live_scores: Tensor,
                beam_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """A step's finished hypotheses added to ``beams``' (a :class:`Beams` or a grid search's,
    with the same bookkeeping fields): the new ``finished_count`` and ``best_finished``, and
    which sentences are ``done`` now (the rules of :func:`beam_search`).

    Shape:
        - finalize, scores: (N, K) the hypotheses finished at ``step`` and their scores
        - live_scores: (N, R) the live hypotheses' summed log-probabilities
    """
    nbest = beams.best_finished.size(1)
    finished_count = beams.finished_count + finalize.sum(dim=1)
    best_finished = torch.cat([beams.best_finished, scores], dim=1).topk(nbest, dim=1).values
    next_penalty = length_penalty_factor(step + 2.0, beams.length_penalty)
    bound = live_scores.max(dim=1).values / torch.clamp(beams.max_length_penalty,
                                                         min=next_penalty)
    cannot_improve = (finished_count >= nbest) & (bound <= best_finished[:, -1])
    done = (beams.done | (finished_count >= beam_size) | cannot_improve
            | (beams.max_lengths <= step))
    return finished_count, best_finished, done


class Beams(NamedTuple):
    """The sentences a beam search still decodes, one row each (N of them, N shrinking from B as
    sentences leave), with their beams' and finished hypotheses' bookkeeping.

    Attributes:
        sentences: (N,) each row's sentence in the batch.
        tokens: (N, R) the last token of each live beam (BOS at the start, R = 1).
        scores: (N, R) each live beam's summed log-probability (-inf: a dead beam).
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
    def start(cls, max_lengths: Tensor, *, length_penalty: float, nbest: int) -> Beams:
        """Every sentence of the batch with one live beam: BOS, score 0."""
        batch_size, device = max_lengths.numel(), max_lengths.device
        return cls(
            sentences=torch.arange(batch_size, device=device),
            tokens=torch.full((batch_size, 1), BOS_ID, dtype=torch.long, device=device),
            scores=torch.zeros(batch_size, 1, device=device),
            done=torch.zeros(batch_size, dtype=torch.bool, device=device),
            finished_count=torch.zeros(batch_size, dtype=torch.long, device=device),
            best_finished=torch.full((batch_size, nbest), -math.inf, device=device),
            max_lengths=max_lengths,
            max_length_penalty=length_penalty_factor(max_lengths.float() + 1.0, length_penalty),
            length_penalty=length_penalty,
        )

    def advance(self, step: int, *, finalize: Tensor, scores: Tensor, live_scores: Tensor,
                tokens: Tensor) -> Beams:
        """After ``step``: the hypotheses ``finalize`` finished with ``scores`` (N, K), the live
        beams' new ``tokens`` and ``live_scores`` (N, K), and which sentences are done now (see
        :func:`beam_search` for the rules and the bound)."""
        finished_count, best_finished, done = finish_step(
            self, step, finalize=finalize, scores=scores, live_scores=live_scores,
            beam_size=tokens.size(1))
        return self._replace(tokens=tokens, scores=live_scores, done=done,
                             finished_count=finished_count, best_finished=best_finished)

    def prune(self, keep: Tensor) -> Beams:
        """Only the rows ``keep`` (N',): the sentences that stay in the batch."""
        return Beams(*(t[keep] for t in self[:-1]), self.length_penalty)


@torch.inference_mode()
def beam_search(
    model,
    src: Tensor,
    src_lengths: Tensor,
    *,
    beam_size: int,
    length_penalty: float = 1.0,
    max_len_a: float,
    max_len_b: float,
    nbest: int = 1,
    return_attention: bool = False,
    prefixes: Tensor | None = None,
) -> list[list[Hypothesis]]:
    """Batched beam search with per-sentence finished-hypothesis bookkeeping.

    At each step every sentence ranks the ``2 K`` best (beam, next token) candidates by summed
    log-probability. EOS candidates ranked among the first ``K`` become finished hypotheses
    (scored with the length penalty); the ``K`` best non-EOS candidates form the next beam.
    Ranking ``2 K`` candidates guarantees ``K`` non-EOS ones are among them.

    A sentence is done, and adds no more finished hypotheses, when any of these holds:

    - it has ``K`` finished hypotheses (so beam size 1 is exactly greedy search);
    - it has ``nbest`` finished hypotheses and no live beam can beat the ``nbest``-th of
      them even at the longest allowed length (the summed log-probability only decreases, so
      ``best live sum / max(lp(next length), lp(max length))`` bounds every continuation);
    - its output length limit was reached (EOS was forced on every beam).

    The search stops when every sentence is done; a done sentence leaves the batch (see the
    module docstring).

    Args:
        model: a :class:`DecodingModel` (e.g. a :class:`~seq2seq.models.seq2seq.Seq2Seq`),
            in eval mode.
        src: source ids, padded with PAD_ID.
        src_lengths: real source lengths, best on the CPU (the length limits are read there).
        beam_size: beams per sentence (K).
        length_penalty: GNMT alpha; 0 ranks by summed log-probability.
        max_len_a: output length limit ``floor(a * source length + b)`` (EOS not counted).
        max_len_b: see ``max_len_a``.
        nbest: hypotheses returned per sentence (at most ``beam_size``).
        return_attention: also return each hypothesis' attention weights.
        prefixes: as for :func:`greedy_search`: every hypothesis starts with its prefix.

    Returns:
        Per sentence, in input order, up to ``nbest`` distinct hypotheses, best first. Fewer
        than ``nbest`` only happens when the length limit or a tiny vocabulary leaves fewer
        live beams.

    Raises:
        ValueError: if ``beam_size < 1`` or ``nbest`` is not in ``1..beam_size``.

    Shape:
        - src: (B, S) int64
        - src_lengths: (B,) int64
    """
    check_beam_options(beam_size, nbest)
    batch_size, source_len = src.shape
    if batch_size == 0:
        return []
    K = beam_size
    device = src.device
    encoded, state, max_lengths, max_steps, first_forced_step = start_search(
        model, src, src_lengths, max_len_a=max_len_a, max_len_b=max_len_b, prefixes=prefixes)
    beams = Beams.start(max_lengths, length_penalty=length_penalty, nbest=nbest)
    # The decoder reads R rows per sentence: one (its BOS) until the first step gives it K beams.
    row_encoded = encoded
    segments = [(0, beams.sentences)]  # (first step, sentences decoded from then on)

    # History of the sentences decoded at each step, kept on the device; scattered into
    # full-batch (T, B, ...) tensors and read back once at the end.
    history_tokens: list[Tensor] = []  # token chosen into each beam slot, each (N, K)
    history_parents: list[Tensor] = []  # the row (0..R-1) it extends, each (N, K)
    history_weights: list[Tensor] = []  # attention of each row at that step, each (N, K, S)
    finals_mask: list[Tensor] = []  # EOS candidates that became finished hypotheses, (N, K)
    finals_scores: list[Tensor] = []  # their length-penalised scores, (N, K)
    finals_parents: list[Tensor] = []  # the row they extend, (N, K)

    for step in range(max_steps):
        active, rows = beams.scores.shape  # N sentences, R rows each
        logits, weights, state = model.decode_step(  # (N*R, V), (N*R, S)
            beams.tokens.reshape(-1), state, row_encoded)
        vocab_size = logits.size(-1)
        forced = forced_tokens(step, beams.max_lengths, first_forced_step, prefixes,
                               beams.sentences)  # (N,) or None
        if forced is not None:
            forced = forced.repeat_interleave(rows)  # (N*R,)
        log_probs = next_token_log_probs(logits, forced)
        candidates = log_probs.view(active, rows, vocab_size).add_(beams.scores.unsqueeze(2))
        top_scores, top_index = top_candidates(candidates.view(active, -1), 2 * K)  # (N, 2K)
        top_parents = top_index // vocab_size  # (N, 2K) the row each extends
        top_tokens = top_index % vocab_size  # (N, 2K)
        is_eos = top_tokens == EOS_ID  # (N, 2K)

        # Finish the EOS candidates ranked among the first K, for sentences still searching.
        finalize = is_eos[:, :K] & torch.isfinite(top_scores[:, :K]) & ~beams.done.unsqueeze(1)
        scores = top_scores[:, :K] / length_penalty_factor(step + 1.0, length_penalty)
        scores = scores.masked_fill(~finalize, -math.inf)  # (N, K)
        finals_mask.append(finalize)
        finals_scores.append(scores)
        finals_parents.append(top_parents[:, :K])

        # Continue with the K best non-EOS candidates.
        live_scores, live_rank = top_scores.masked_fill(is_eos, -math.inf).topk(K, dim=1)
        parents = top_parents.gather(1, live_rank)  # (N, K)
        history_tokens.append(top_tokens.gather(1, live_rank))
        history_parents.append(parents)
        if return_attention:
            weights = weights.float().view(active, rows, source_len)
            history_weights.append(weights.expand(active, K, source_len))  # R = 1: one row
        beams = beams.advance(step, finalize=finalize, scores=scores, live_scores=live_scores,
                              tokens=history_tokens[-1])
        done_count = int(beams.done.sum())  # the one host sync per step
        if done_count == active:
            break
        # The decoder row each new beam continues, in the (N*R) rows just decoded.
        state_rows = (torch.arange(active, device=device) * rows).unsqueeze(1) + parents  # (N, K)
        pruned = prune_now(done_count, active)
        if pruned:
            keep = kept_rows(beams.done, active - done_count)  # (N',)
            beams, state_rows = beams.prune(keep), state_rows[keep]
            encoded = encoded.index_select(keep)
            segments.append((step + 1, beams.sentences))
        state = select_state(state, state_rows.view(-1))  # follow the beams (and prune) at once
        if pruned or rows != K:  # the rows per sentence changed: the source again, per beam
            per_beam = torch.arange(beams.sentences.numel(), device=device).repeat_interleave(K)
            row_encoded = encoded.index_select(per_beam)  # (N*K) rows

    index = history_index(segments, len(history_tokens), batch_size)
    found = collect_hypotheses(
        src_lengths=src_lengths,
        nbest=nbest,
        history_tokens=full_history(history_tokens, index, batch_size, 0).cpu(),  # (T, B, K)
        history_parents=full_history(history_parents, index, batch_size, 0).cpu(),
        history_weights=(
            full_history(history_weights, index, batch_size, 0.0).cpu()  # (T, B, K, S)
            if return_attention
            else None
        ),
        finals_mask=full_history(finals_mask, index, batch_size, False).cpu(),
        finals_scores=full_history(finals_scores, index, batch_size, -math.inf).cpu(),
        finals_parents=full_history(finals_parents, index, batch_size, 0).cpu(),
    )
    return [[Hypothesis(*hypothesis) for hypothesis in n_best] for n_best in found]
