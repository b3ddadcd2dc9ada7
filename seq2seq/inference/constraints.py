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

Conventions (scores, length penalty, stopping, nbest, attention) are beam search's; finished
sentences are masked rather than pruned from the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from seq2seq.data.vocab import BOS_ID, EOS_ID
from seq2seq.inference.search import (
    Hypothesis,
    check_beam_options,
    forced_tokens,
    in_autocast_dtype,
    length_penalty_factor,
    max_output_lengths,
    next_token_log_probs,
    top_candidates,
)
from seq2seq.inference.search_history import collect_hypotheses
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
    max_length_penalty = length_penalty_factor(max_lengths.float() + 1.0, length_penalty)

    encoded = in_autocast_dtype(model.encode(src, src_lengths), device.type)
    row_encoded = encoded.index_select(torch.arange(batch_size, device=device)
                                       .repeat_interleave(rows))  # (B*R) rows
    state = model.init_state(row_encoded)
    sentences = torch.arange(batch_size, device=device)

    scores = torch.full((batch_size, rows), -math.inf, device=device)  # (B, R)
    scores[:, 0] = 0.0  # one live hypothesis at the start: BOS in bank 0
    tokens = torch.full((batch_size, rows), BOS_ID, dtype=torch.long, device=device)
    met = torch.zeros(batch_size, rows, dtype=torch.long, device=device)  # phrases met, bits
    inside = torch.full((batch_size, rows), -1, dtype=torch.long, device=device)  # its phrase
    position = torch.zeros(batch_size, rows, dtype=torch.long, device=device)  # in that phrase
    done = torch.zeros(batch_size, dtype=torch.bool, device=device)
    finished_count = torch.zeros(batch_size, dtype=torch.long, device=device)
    best_finished = torch.full((batch_size, nbest), -math.inf, device=device)
    phrase_bits = 1 << torch.arange(num_phrases, device=device)  # (P,)
    top_bank = pieces.unsqueeze(1)  # (B, 1)
    eos_banned = (row_bank.unsqueeze(0) != top_bank)  # (B, R): EOS only from the top bank
    sentence_index = torch.arange(batch_size, device=device).view(-1, 1, 1)

    history_tokens, history_parents, history_weights = [], [], []
    finals_mask, finals_scores, finals_parents = [], [], []
    for step in range(max_steps):
        logits, weights, state = model.decode_step(tokens.view(-1), state, row_encoded)
        vocab_size = logits.size(-1)
        forced = forced_tokens(step, max_lengths, first_forced_step, prefixes, sentences)
        if forced is not None:
            forced = forced.repeat_interleave(rows)  # (B*R,)
        log_probs = next_token_log_probs(logits, forced).view(batch_size, rows, vocab_size)

        # Free continuations stay in their bank; none for a hypothesis inside a phrase.
        free = log_probs + scores.unsqueeze(2)  # (B, R, V)
        free[:, :, EOS_ID].masked_fill_(eos_banned, -math.inf)
        free.masked_fill_((inside >= 0).unsqueeze(2), -math.inf)
        # Constraint pieces move up a bank: the next piece of the phrase a hypothesis is
        # inside, else the first piece of each phrase it has not met. (B, R, P), -1: none.
        unmet = ((met.unsqueeze(2) & phrase_bits) == 0) & (phrase_lengths.unsqueeze(1) > 0)
        starts = torch.where(unmet, phrases[:, :, 0].unsqueeze(1), -1)  # (B, R, P)
        continuing = phrases[sentence_index, inside.clamp(min=0).unsqueeze(2),
                             position.unsqueeze(2)]  # (B, R, 1) the next piece inside
        in_this = torch.arange(num_phrases, device=device) == inside.unsqueeze(2)  # (B, R, P)
        next_piece = torch.where((inside >= 0).unsqueeze(2),
                                 torch.where(in_this, continuing, -1), starts)  # (B, R, P)
        constrained = log_probs.gather(2, next_piece.clamp(min=0)) + scores.unsqueeze(2)
        constrained.masked_fill_(next_piece < 0, -math.inf)  # (B, R, P)

        # Bank b's candidates: free ones from bank b, constraint ones from bank b - 1.
        from_below = constrained.view(batch_size, banks, K * num_phrases)
        from_below = torch.cat([torch.full_like(from_below[:, :1], -math.inf),
                                from_below[:, :-1]], dim=1)  # (B, banks, K*P)
        candidates = torch.cat([free.view(batch_size, banks, K * vocab_size), from_below], 2)
        top_scores, top_index = top_candidates(candidates.view(batch_size * banks, -1), 2 * K)
        top_scores = top_scores.view(batch_size, banks, 2 * K)
        top_index = top_index.view(batch_size, banks, 2 * K)
        is_free = top_index < K * vocab_size
        bank_of = torch.arange(banks, device=device).view(1, -1, 1)
        parent = torch.where(  # (B, banks, 2K) the row each candidate extends
            is_free, bank_of * K + top_index // vocab_size,
            (bank_of - 1) * K + (top_index - K * vocab_size) // num_phrases)
        parent = parent.clamp(0, rows - 1)  # -inf fillers of bank 0 point anywhere
        phrase = (top_index - K * vocab_size) % num_phrases  # for constraint candidates
        piece = next_piece.view(batch_size, -1).gather(
            1, (parent * num_phrases + phrase).view(batch_size, -1)).view_as(parent)
        token = torch.where(is_free, top_index % vocab_size, piece)  # (B, banks, 2K)
        is_eos = is_free & (token == EOS_ID)

        # Finish the EOS candidates ranked among the top bank's first K.
        top = top_bank.view(-1, 1, 1).expand(-1, 1, 2 * K)
        final_scores, final_eos = top_scores.gather(1, top)[:, 0], is_eos.gather(1, top)[:, 0]
        finalize = final_eos[:, :K] & torch.isfinite(final_scores[:, :K]) & ~done.unsqueeze(1)
        penalised = final_scores[:, :K] / length_penalty_factor(step + 1.0, length_penalty)
        penalised = penalised.masked_fill(~finalize, -math.inf)  # (B, K)
        finals_mask.append(finalize)
        finals_scores.append(penalised)
        finals_parents.append(parent.gather(1, top)[:, 0, :K])
        finished_count += finalize.sum(dim=1)
        best_finished = torch.cat([best_finished, penalised], 1).topk(nbest, dim=1).values

        # Each bank continues with its K best non-EOS candidates.
        live, rank = top_scores.masked_fill(is_eos, -math.inf).topk(K, dim=2)  # (B, banks, K)
        parents = parent.gather(2, rank).view(batch_size, rows)  # (B, R)
        new_tokens = token.gather(2, rank).view(batch_size, rows)
        by_constraint = (~is_free).gather(2, rank).view(batch_size, rows)
        chosen_phrase = phrase.gather(2, rank).view(batch_size, rows)
        history_tokens.append(new_tokens)
        history_parents.append(parents)
        if return_attention:
            history_weights.append(weights.float().view(batch_size, rows, source_len))

        # The new hypotheses' place in their phrases.
        met, inside, position = (t.gather(1, parents) for t in (met, inside, position))
        starting = by_constraint & (inside < 0)
        inside = torch.where(starting, chosen_phrase, inside)
        position = torch.where(by_constraint, position + 1, position)
        complete = by_constraint & (position == phrase_lengths.gather(1, inside.clamp(min=0)))
        met = torch.where(complete, met | phrase_bits[inside.clamp(min=0)], met)
        inside = inside.masked_fill(complete, -1)
        position = position.masked_fill(complete, 0)
        scores, tokens = live.view(batch_size, rows), new_tokens

        next_penalty = length_penalty_factor(step + 2.0, length_penalty)
        bound = scores.max(dim=1).values / torch.clamp(max_length_penalty, min=next_penalty)
        cannot_improve = (finished_count >= nbest) & (bound <= best_finished[:, -1])
        done = done | (finished_count >= K) | cannot_improve | (max_lengths <= step)
        if bool(done.all()):
            break
        state_rows = (torch.arange(batch_size, device=device) * rows).unsqueeze(1) + parents
        state = select_state(state, state_rows.view(-1))

    found = collect_hypotheses(
        src_lengths=src_lengths, nbest=nbest,
        history_tokens=torch.stack(history_tokens).cpu(),  # (T, B, R)
        history_parents=torch.stack(history_parents).cpu(),
        history_weights=torch.stack(history_weights).cpu() if return_attention else None,
        finals_mask=torch.stack(finals_mask).cpu(),
        finals_scores=torch.stack(finals_scores).cpu(),
        finals_parents=torch.stack(finals_parents).cpu(),
    )
    return [[Hypothesis(*hypothesis) for hypothesis in n_best] for n_best in found]
