"""Lexically constrained beam search: every translation contains every phrase asked for.

Grid beam search (Hokamp & Liu, 2017), batched like :func:`~seq2seq.inference.search.beam_search`.
A sentence whose phrases hold C pieces in all keeps C + 1 *banks* of K hypotheses each, bank c
holding those that have produced c constraint pieces. At each step a hypothesis either

- generates freely (any piece, staying in its bank), unless it is inside a phrase, or
- produces the next constraint piece (moving up one bank): the next piece of the phrase it is
  inside, or else the first piece of a phrase it has not met yet (it is then inside it);

and every bank keeps its K best candidates. Only the top bank (every phrase met) may produce
EOS, so every finished hypothesis contains every phrase, at every beam size, 1 included. A
phrase, once started, is produced whole (pieces in a row); the phrases may come in any order.
A hypothesis that happens to produce a phrase while generating freely does not count it (its
twin through the constraint route is in the bank above).

The output length limit of a sentence grows to hold its prefix and all its phrases, so the top
bank is always reached. Why grid beam search rather than dynamic beam allocation (Post & Vilar,
2018), which shares one beam of K between the banks: with a beam smaller than the number of
banks, dynamic allocation cannot keep a hypothesis in each bank and may end with none that
meets every phrase; the grid always can, for C + 1 times the rows per step
(docs/evaluate-translate.md measures the cost).

Conventions (scores, length penalty, stopping, nbest, attention, finished sentences leaving
the batch) are beam search's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from seq2seq.data.vocab import BOS_ID, EOS_ID
from seq2seq.inference.search import (
    Hypothesis,
    check_beam_options,
    finish_step,
    forced_tokens,
    in_autocast_dtype,
    kept_rows,
    length_penalty_factor,
    max_output_lengths,
    next_token_log_probs,
    prune_now,
    top_candidates,
)
from seq2seq.inference.search_history import collect_hypotheses, full_history, history_index
from seq2seq.models.interfaces import DecodingModel, select_state

# Phrases met are a bit mask per hypothesis (int64).
MAX_PHRASES = 62


def pad_phrases(constraints: Sequence[Sequence[Sequence[int]]], device) -> tuple[Tensor, Tensor]:
    """Each sentence's phrases (lists of piece ids) as one tensor.

    Shape:
        - output: phrases (B, P, L) int64, -1 after a phrase's end and for missing phrases;
          lengths (B, P), 0 for missing phrases

    Raises:
        ValueError: on an empty phrase or more than :data:`MAX_PHRASES` phrases in a sentence.
    """
    count = max((len(phrases) for phrases in constraints), default=0)
    width = max((len(phrase) for phrases in constraints for phrase in phrases), default=0)
    padded = torch.full((len(constraints), max(count, 1), max(width, 1)), -1, dtype=torch.long)
    lengths = torch.zeros(len(constraints), max(count, 1), dtype=torch.long)
    for row, phrases in enumerate(constraints):
        if len(phrases) > MAX_PHRASES:
            raise ValueError(f"sentence {row + 1} has {len(phrases)} constraints; at most "
                             f"{MAX_PHRASES} are supported")
        for number, phrase in enumerate(phrases):
            if not phrase:
                raise ValueError(f"sentence {row + 1}: constraint {number + 1} is empty")
            padded[row, number, : len(phrase)] = torch.as_tensor(list(phrase))
            lengths[row, number] = len(phrase)
    return padded.to(device), lengths.to(device)


class Grid(NamedTuple):
    """The sentences a grid beam search still decodes (N of them, N shrinking from B as
    sentences finish), each with R = banks x K rows, and their phrases' bookkeeping.

    Attributes:
        sentences: (N,) each row's sentence in the batch.
        phrases, phrase_lengths: (N, P, L), (N, P) as :func:`pad_phrases` gives them.
        pieces: (N,) the constraint pieces of each sentence: its top bank.
        tokens: (N, R) the last token of each hypothesis (BOS at the start).
        scores: (N, R) each hypothesis' summed log-probability (-inf: none in that row).
        met: (N, R) the phrases it has written whole, one bit each.
        inside: (N, R) the phrase it is inside (-1: none); position: the pieces of it written.
        done, finished_count, best_finished, max_lengths, max_length_penalty, length_penalty:
            as for :class:`~seq2seq.inference.search.Beams`.
    """

    sentences: Tensor
    phrases: Tensor
    phrase_lengths: Tensor
    pieces: Tensor
    tokens: Tensor
    scores: Tensor
    met: Tensor
    inside: Tensor
    position: Tensor
    done: Tensor
    finished_count: Tensor
    best_finished: Tensor
    max_lengths: Tensor
    max_length_penalty: Tensor
    length_penalty: float

    @classmethod
    def start(cls, phrases: Tensor, phrase_lengths: Tensor, max_lengths: Tensor, *, rows: int,
              length_penalty: float, nbest: int) -> Grid:
        """One live hypothesis per sentence: BOS in bank 0, score 0."""
        batch_size, device = phrases.size(0), phrases.device
        scores = torch.full((batch_size, rows), -math.inf, device=device)
        scores[:, 0] = 0.0
        zeros = torch.zeros(batch_size, rows, dtype=torch.long, device=device)
        return cls(
            sentences=torch.arange(batch_size, device=device),
            phrases=phrases, phrase_lengths=phrase_lengths, pieces=phrase_lengths.sum(dim=1),
            tokens=torch.full((batch_size, rows), BOS_ID, dtype=torch.long, device=device),
            scores=scores, met=zeros, inside=zeros - 1, position=zeros,
            done=torch.zeros(batch_size, dtype=torch.bool, device=device),
            finished_count=torch.zeros(batch_size, dtype=torch.long, device=device),
            best_finished=torch.full((batch_size, nbest), -math.inf, device=device),
            max_lengths=max_lengths,
            max_length_penalty=length_penalty_factor(max_lengths.float() + 1.0, length_penalty),
            length_penalty=length_penalty,
        )

    def advance(self, step: int, *, parents: Tensor, tokens: Tensor, scores: Tensor,
                by_constraint: Tensor, chosen_phrase: Tensor, finalize: Tensor,
                finished_scores: Tensor, beam_size: int) -> Grid:
        """After ``step``: the new hypotheses (each (N, R): the row each extends, its token and
        score, whether that token was a constraint piece and of which phrase), the hypotheses
        ``finalize`` finished with ``finished_scores`` (N, K), and which sentences are done now
        (the rules of :func:`~seq2seq.inference.search.beam_search`)."""
        met, inside, position = (t.gather(1, parents) for t in (self.met, self.inside,
                                                                 self.position))
        by_constraint = by_constraint & torch.isfinite(scores)  # a -inf filler stays put
        inside = torch.where(by_constraint & (inside < 0), chosen_phrase, inside)
        position = torch.where(by_constraint, position + 1, position)
        complete = by_constraint & (position == self.phrase_lengths.gather(1, inside.clamp(min=0)))
        bits = 1 << inside.clamp(min=0)
        met = torch.where(complete, met | bits, met)
        inside = inside.masked_fill(complete, -1)
        position = position.masked_fill(complete, 0)

        finished_count, best_finished, done = finish_step(
            self, step, finalize=finalize, scores=finished_scores, live_scores=scores,
            beam_size=beam_size)
        return self._replace(tokens=tokens, scores=scores, met=met, inside=inside,
                             position=position, done=done, finished_count=finished_count,
                             best_finished=best_finished)

    def prune(self, keep: Tensor) -> Grid:
        """Only the rows ``keep`` (N',): the sentences that stay in the batch."""
        return Grid(*(t[keep] for t in self[:-1]), self.length_penalty)


@torch.inference_mode()
def constrained_beam_search(
    model: DecodingModel,
    src: Tensor,
    src_lengths: Tensor,
    *,
    constraints: Sequence[Sequence[Sequence[int]]],
    beam_size: int,
    length_penalty: float = 1.0,
    max_len_a: float,
    max_len_b: float,
    nbest: int = 1,
    return_attention: bool = False,
    prefixes: Tensor | None = None,
) -> list[list[Hypothesis]]:
    """Beam search whose every hypothesis contains each sentence's phrases (module docstring).

    Args:
        constraints: per sentence, its phrases as lists of target piece ids (may be none).
        others: as for :func:`~seq2seq.inference.search.beam_search`.

    Returns:
        Per sentence, in input order, up to ``nbest`` hypotheses, best first, each holding
        every phrase of its sentence.

    Raises:
        ValueError: on ``beam_size < 1``, ``nbest`` outside ``1..beam_size``, an empty phrase,
            or too many phrases.
    """
    check_beam_options(beam_size, nbest)
    batch_size, source_len = src.shape
    if batch_size == 0:
        return []
    if len(constraints) != batch_size:
        raise ValueError(f"{batch_size} sentences but {len(constraints)} constraint lists")
    K, device = beam_size, src.device
    phrases, phrase_lengths = pad_phrases(constraints, device)  # (B, P, L), (B, P)
    num_phrases = phrases.size(1)
    pieces = phrase_lengths.sum(dim=1)  # (B,) C_s: the constraint pieces of each sentence
    banks = int(pieces.max()) + 1
    rows = banks * K  # R rows per sentence: bank b is rows b*K .. b*K + K - 1
    row_bank = torch.arange(rows, device=device) // K  # (R,)

    # The limit grows to hold the prefix and every phrase, so the top bank is always reached.
    max_lengths = max_output_lengths(src_lengths, max_len_a=max_len_a, max_len_b=max_len_b)
    max_lengths = max_lengths.to(device)
    needed = pieces + (0 if prefixes is None else (prefixes >= 0).sum(dim=1))
    max_lengths = torch.maximum(max_lengths, needed)
    max_steps = int(max_lengths.max()) + 1  # + 1 for the EOS step
    first_forced_step = int(max_lengths.min())

    encoded = in_autocast_dtype(model.encode(src, src_lengths), device.type)
    row_encoded = encoded.index_select(torch.arange(batch_size, device=device)
                                       .repeat_interleave(rows))  # (B*R) rows
    state = model.init_state(row_encoded)
    grid = Grid.start(phrases, phrase_lengths, max_lengths, rows=rows,
                      length_penalty=length_penalty, nbest=nbest)
    segments = [(0, grid.sentences)]  # (first step, sentences decoded from then on)
    phrase_bits = 1 << torch.arange(num_phrases, device=device)  # (P,)
    phrase_numbers = torch.arange(num_phrases, device=device)  # (P,)
    bank_of = torch.arange(banks, device=device).view(1, -1, 1)

    history_tokens, history_parents, history_weights = [], [], []
    finals_mask, finals_scores, finals_parents = [], [], []
    for step in range(max_steps):
        active = grid.sentences.numel()  # N sentences still searching, R rows each
        logits, weights, state = model.decode_step(grid.tokens.view(-1), state, row_encoded)
        vocab_size = logits.size(-1)
        forced = forced_tokens(step, grid.max_lengths, first_forced_step, prefixes,
                               grid.sentences)
        if forced is not None:
            forced = forced.repeat_interleave(rows)  # (N*R,)
        log_probs = next_token_log_probs(logits, forced).view(active, rows, vocab_size)

        # Free continuations stay in their bank; none for a hypothesis inside a phrase.
        inside_phrase = grid.inside >= 0  # (N, R)
        free = log_probs + grid.scores.masked_fill(inside_phrase, -math.inf).unsqueeze(2)
        eos_banned = row_bank.unsqueeze(0) != grid.pieces.unsqueeze(1)  # (N, R): top bank only
        free[:, :, EOS_ID].masked_fill_(eos_banned, -math.inf)
        # Each bank's 2K best free candidates, before the few constraint ones join them.
        free_scores, free_index = top_candidates(free.view(active * banks, K * vocab_size), 2 * K)
        # Constraint pieces move up a bank: the next piece of the phrase a hypothesis is
        # inside, else the first piece of each phrase it has not met. (N, R, P), -1: none.
        unmet = ((grid.met.unsqueeze(2) & phrase_bits) == 0) & (grid.phrase_lengths.unsqueeze(1) > 0)
        starts = torch.where(unmet, grid.phrases[:, :, 0].unsqueeze(1), -1)  # (N, R, P)
        sentence_index = torch.arange(active, device=device).view(-1, 1, 1)
        continuing = grid.phrases[sentence_index, grid.inside.clamp(min=0).unsqueeze(2),
                                  grid.position.unsqueeze(2)]  # (N, R, 1) the next piece inside
        in_this = phrase_numbers == grid.inside.unsqueeze(2)  # (N, R, P)
        next_piece = torch.where(inside_phrase.unsqueeze(2),
                                 torch.where(in_this, continuing, -1), starts)  # (N, R, P)
        constrained = log_probs.gather(2, next_piece.clamp(min=0)) + grid.scores.unsqueeze(2)
        constrained.masked_fill_(next_piece < 0, -math.inf)  # (N, R, P)

        # Bank b's candidates: free ones from bank b, constraint ones from bank b - 1. A
        # candidate's index is into bank b's free (K*V) then its constraint (K*P) scores.
        from_below = constrained.view(active, banks, K * num_phrases)
        from_below = torch.cat([torch.full_like(from_below[:, :1], -math.inf),
                                from_below[:, :-1]], dim=1)  # (N, banks, K*P)
        candidates = torch.cat([free_scores.view(active, banks, 2 * K), from_below], dim=2)
        top_scores, pick = candidates.topk(2 * K, dim=2)  # (N, banks, 2K)
        is_free = pick < 2 * K
        top_index = torch.where(
            is_free, free_index.view(active, banks, 2 * K).gather(2, pick.clamp(max=2 * K - 1)),
            K * vocab_size + pick - 2 * K)
        parent = torch.where(  # (N, banks, 2K) the row each candidate extends
            is_free, bank_of * K + top_index // vocab_size,
            (bank_of - 1) * K + (top_index - K * vocab_size) // num_phrases)
        parent = parent.clamp(0, rows - 1)  # -inf fillers of bank 0 point anywhere
        phrase = (top_index - K * vocab_size) % num_phrases  # for constraint candidates
        piece = next_piece.view(active, -1).gather(
            1, (parent * num_phrases + phrase).view(active, -1)).view_as(parent)
        # (N, banks, 2K); a -inf filler may have no piece (-1): any id will do, it never scores.
        token = torch.where(is_free, top_index % vocab_size, piece.clamp(min=0))
        is_eos = is_free & (token == EOS_ID)

        # Finish the EOS candidates ranked among the top bank's first K.
        top = grid.pieces.view(-1, 1, 1).expand(-1, 1, 2 * K)
        final_scores, final_eos = top_scores.gather(1, top)[:, 0], is_eos.gather(1, top)[:, 0]
        finalize = final_eos[:, :K] & torch.isfinite(final_scores[:, :K]) & ~grid.done.unsqueeze(1)
        penalised = final_scores[:, :K] / length_penalty_factor(step + 1.0, length_penalty)
        penalised = penalised.masked_fill(~finalize, -math.inf)  # (N, K)
        finals_mask.append(finalize)
        finals_scores.append(penalised)
        finals_parents.append(parent.gather(1, top)[:, 0, :K])

        # Each bank continues with its K best non-EOS candidates.
        live, rank = top_scores.masked_fill(is_eos, -math.inf).topk(K, dim=2)  # (N, banks, K)
        parents = parent.gather(2, rank).view(active, rows)  # (N, R)
        new_tokens = token.gather(2, rank).view(active, rows)
        by_constraint = (~is_free).gather(2, rank).view(active, rows)
        chosen_phrase = phrase.gather(2, rank).view(active, rows)
        history_tokens.append(new_tokens)
        history_parents.append(parents)
        if return_attention:
            history_weights.append(weights.float().view(active, rows, source_len))
        grid = grid.advance(step, parents=parents, tokens=new_tokens, scores=live.view(active, rows),
                            by_constraint=by_constraint, chosen_phrase=chosen_phrase,
                            finalize=finalize, finished_scores=penalised, beam_size=K)
        done_count = int(grid.done.sum())  # the one host sync per step
        if done_count == active:
            break
        state_rows = (torch.arange(active, device=device) * rows).unsqueeze(1) + parents  # (N, R)
        if prune_now(done_count, active):  # finished sentences leave the batch
            keep = kept_rows(grid.done, active - done_count)  # (N',)
            grid, state_rows = grid.prune(keep), state_rows[keep]
            encoded = encoded.index_select(keep)
            row_encoded = encoded.index_select(torch.arange(keep.numel(), device=device)
                                               .repeat_interleave(rows))
            segments.append((step + 1, grid.sentences))
        state = select_state(state, state_rows.view(-1))

    index = history_index(segments, len(history_tokens), batch_size)
    found = collect_hypotheses(
        src_lengths=src_lengths, nbest=nbest,
        history_tokens=full_history(history_tokens, index, batch_size, 0).cpu(),  # (T, B, R)
        history_parents=full_history(history_parents, index, batch_size, 0).cpu(),
        history_weights=(full_history(history_weights, index, batch_size, 0.0).cpu()
                         if return_attention else None),
        finals_mask=full_history(finals_mask, index, batch_size, False).cpu(),
        finals_scores=full_history(finals_scores, index, batch_size, -math.inf).cpu(),
        finals_parents=full_history(finals_parents, index, batch_size, 0).cpu(),
    )
    return [[Hypothesis(*hypothesis) for hypothesis in n_best] for n_best in found]
