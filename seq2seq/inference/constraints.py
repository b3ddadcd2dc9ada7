"""Lexically constrained beam search: every translation contains every phrase asked for.

Grid beam search (Hokamp & Liu, 2017), batched like beam search:
:func:`~seq2seq.inference.search_loop.run_search` with the :class:`Grid` strategy (what ``search=beam``
runs for a batch with constraints, :class:`~seq2seq.inference.searches.BeamSearch`). Every
hypothesis returned holds every phrase of its sentence.
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
bank is always reached. docs/evaluate-translate.md ("Which search runs", "Its cost") says why
the grid rather than dynamic beam allocation, and measures its C + 1 times the rows per step.

Conventions (scores, length penalty, stopping, nbest, attention, finished sentences leaving
the batch) are beam search's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from seq2seq.data.vocab import BOS_ID, EOS_ID, PAD_ID
from seq2seq.inference.search_loop import Step, Strategy, split_ranked, top_candidates

# Phrases met are a bit mask per hypothesis (int64).
MAX_PHRASES = 62


def pad_phrases(constraints: Sequence[Sequence[Sequence[int]]], device) -> tuple[Tensor, Tensor]:
    """Each sentence's phrases (lists of piece ids) as one tensor, refusing an empty phrase,
    one holding PAD, BOS or EOS (never generated, or ending a hypothesis) and more than
    :data:`MAX_PHRASES` in a sentence.

    Shape:
        - output: phrases (B, P, L) int64, -1 after a phrase's end and for missing phrases;
          lengths (B, P), 0 for missing phrases
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
            if set(phrase) & {PAD_ID, BOS_ID, EOS_ID}:
                raise ValueError(f"sentence {row + 1}: constraint {number + 1} holds a special "
                                 f"piece (PAD, BOS or EOS)")
            padded[row, number, : len(phrase)] = torch.as_tensor(list(phrase))
            lengths[row, number] = len(phrase)
    return padded.to(device), lengths.to(device)


class Grid(Strategy):
    """The grid's :class:`~seq2seq.inference.search_loop.Strategy`: each sentence has R = banks x K
    rows, bank b the rows b*K .. b*K + K - 1, and the bookkeeping of their phrases.

    ``beam_size`` is K, the hypotheses each bank keeps.

    Attributes (per sentence still in the batch, N of them):
        phrases, phrase_lengths: (N, P, L), (N, P) as :func:`pad_phrases` gives them.
        pieces: (N,) the constraint pieces of each sentence: its top bank.
        met: (N, R) the phrases each hypothesis has written whole, one bit each.
        inside: (N, R) the phrase it is inside (-1: none); position: the pieces of it written.
    """

    def __init__(self, constraints: Sequence[Sequence[Sequence[int]]], beam_size: int,
                 device) -> None:
        self.phrases, self.phrase_lengths = pad_phrases(constraints, device)  # (B, P, L), (B, P)
        self.pieces = self.phrase_lengths.sum(dim=1)  # (B,)
        self.beam_size = beam_size
        self.banks = int(self.pieces.max()) + 1
        self.start_rows = self.banks * beam_size
        self.required_tokens = self.pieces  # the top bank is always reached
        num_phrases = self.phrases.size(1)
        self.phrase_bits = 1 << torch.arange(num_phrases, device=device)  # (P,)
        self.phrase_numbers = torch.arange(num_phrases, device=device)  # (P,)
        self.row_bank = torch.arange(self.start_rows, device=device) // beam_size  # (R,)
        self.bank_of = torch.arange(self.banks, device=device).view(1, -1, 1)
        self.met = torch.zeros(len(constraints), self.start_rows, dtype=torch.long, device=device)
        self.inside = self.met - 1
        self.position = self.met

    def candidates(self, log_probs: Tensor, scores: Tensor) -> Step:
        """Each bank's 2K best, split as beam search splits them: free candidates from its own
        rows, constraint pieces from the bank below. EOS finishes only from the top bank, the
        one holding every phrase."""
        active, rows, vocab_size = log_probs.shape
        K, banks, num_phrases = self.beam_size, self.banks, self.phrases.size(1)
        # Free continuations stay in their bank; none for a hypothesis inside a phrase.
        inside_phrase = self.inside >= 0  # (N, R)
        free = log_probs + scores.masked_fill(inside_phrase, -math.inf).unsqueeze(2)
        eos_banned = self.row_bank.unsqueeze(0) != self.pieces.unsqueeze(1)  # (N, R): top only
        free[:, :, EOS_ID].masked_fill_(eos_banned, -math.inf)
        # Each bank's 2K best free candidates, before the few constraint ones join them.
        free_scores, free_index = top_candidates(free.view(active * banks, K * vocab_size), 2 * K)
        # Constraint pieces move up a bank: the next piece of the phrase a hypothesis is
        # inside, else the first piece of each phrase it has not met. (N, R, P), -1: none.
        unmet = (((self.met.unsqueeze(2) & self.phrase_bits) == 0)
                 & (self.phrase_lengths.unsqueeze(1) > 0))
        starts = torch.where(unmet, self.phrases[:, :, 0].unsqueeze(1), -1)  # (N, R, P)
        sentence_index = torch.arange(active, device=scores.device).view(-1, 1, 1)
        continuing = self.phrases[sentence_index, self.inside.clamp(min=0).unsqueeze(2),
                                  self.position.unsqueeze(2)]  # (N, R, 1) the next piece inside
        in_this = self.phrase_numbers == self.inside.unsqueeze(2)  # (N, R, P)
        next_piece = torch.where(inside_phrase.unsqueeze(2),
                                 torch.where(in_this, continuing, -1), starts)  # (N, R, P)
        constrained = log_probs.gather(2, next_piece.clamp(min=0)) + scores.unsqueeze(2)
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
            is_free, self.bank_of * K + top_index // vocab_size,
            (self.bank_of - 1) * K + (top_index - K * vocab_size) // num_phrases)
        parent = parent.clamp(0, rows - 1)  # -inf fillers of bank 0 point anywhere
        phrase = (top_index - K * vocab_size) % num_phrases  # for constraint candidates
        piece = next_piece.view(active, -1).gather(
            1, (parent * num_phrases + phrase).view(active, -1)).view_as(parent)
        # A -inf filler may have no piece (-1): any id will do, it never scores. No piece is
        # EOS (pad_phrases refuses special ids), so only free candidates finish.
        token = torch.where(is_free, top_index % vocab_size, piece.clamp(min=0))
        found, kept = split_ranked(top_scores, parent, token, K)  # (N, banks, K) each
        marks = phrase.masked_fill(is_free, -1).gather(2, kept)  # -1: free
        top_bank = self.pieces.view(-1, 1, 1).expand(-1, 1, K)  # EOS finishes from there only
        found = Step(finish_scores=found.finish_scores.gather(1, top_bank).squeeze(1),  # (N, K)
                     finish_parents=found.finish_parents.gather(1, top_bank).squeeze(1),
                     scores=found.scores.view(active, -1),  # (N, R'), R' = banks * K
                     parents=found.parents.view(active, -1),
                     tokens=found.tokens.view(active, -1))
        self.follow(found.parents, marks.view(active, -1), found.scores)
        return found

    def follow(self, parents: Tensor, marks: Tensor, scores: Tensor) -> None:
        """The next rows' phrases: each extends row ``parents`` (N, R') with score ``scores``
        and, where ``marks`` >= 0, that phrase's next piece (entering the phrase, or meeting it
        with its last piece)."""
        met, inside, position = (t.gather(1, parents) for t in (self.met, self.inside,
                                                                 self.position))
        by_constraint = (marks >= 0) & torch.isfinite(scores)  # a -inf filler stays put
        inside = torch.where(by_constraint & (inside < 0), marks, inside)
        position = torch.where(by_constraint, position + 1, position)
        complete = by_constraint & (position == self.phrase_lengths.gather(1, inside.clamp(min=0)))
        bits = 1 << inside.clamp(min=0)
        self.met = torch.where(complete, met | bits, met)
        self.inside = inside.masked_fill(complete, -1)
        self.position = position.masked_fill(complete, 0)

    def prune(self, keep: Tensor) -> None:
        for name in ("phrases", "phrase_lengths", "pieces", "met", "inside", "position"):
            setattr(self, name, getattr(self, name)[keep])
