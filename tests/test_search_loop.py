"""Greedy and beam search: beam 1 is greedy, beam beats greedy, batching changes nothing,
finished sentences leave the batch without changing any output."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import beam_search, greedy_search, padded_random_sources
from omegaconf import OmegaConf

from seq2seq import CONFIG_DIR
from seq2seq.data.vocab import BOS_ID, EOS_ID, PAD_ID
from seq2seq.inference import search_loop as search_module
from seq2seq.inference.forcing import forced_tokens, next_token_log_probs, pad_prefixes
from seq2seq.inference.search_history import full_history, history_index
from seq2seq.inference.search_loop import (
    Hypothesis,
    in_autocast_dtype,
    length_penalty_factor,
    max_output_lengths,
)
from seq2seq.models.build import build_model
from seq2seq.models.interfaces import DecodingModel, EncodedSource

CONFIGS = CONFIG_DIR
VOCAB = 16
# (encoder, decoder, scorer, seed of the EOS table that gives a mix of output lengths)
# The Transformer's state is its growing key/value cache ("-": it takes no scorer).
ARCHITECTURES = [("gru", "bahdanau", "additive", 1), ("lstm", "luong", "multihead", 0),
                 ("transformer", "transformer", "-", 1)]


class EosAfterToken(DecodingModel):
    """Wraps a model and adds ``table[previous token]`` to the EOS logit.

    A random untrained model's wish to stop hardly depends on what it has produced; this
    makes some prefixes end early and others run to the length limit, so the searches
    meet finished and unfinished beams side by side.
    """

    def __init__(self, model, table: torch.Tensor) -> None:
        self.model, self.table = model, table

    def encode(self, src, src_lengths):
        return self.model.encode(src, src_lengths)

    def init_state(self, encoded):
        return self.model.init_state(encoded)

    def decode_step(self, prev_tokens, state, encoded, *, output_ids=None):
        logits, weights, state = self.model.decode_step(prev_tokens, state, encoded)
        logits = logits.clone()
        logits[:, EOS_ID] += self.table[prev_tokens]
        if output_ids is not None:
            logits = logits[:, output_ids]
        return logits, weights, state


def tiny_model(
    encoder: str, decoder: str, scorer: str, table_seed: int | None = None, *, eos_bias: float = 0.0
):
    """A random tiny model from the real YAML groups; ``eos_bias`` shifts EOS's logit.

    With ``table_seed``, EOS also gets a random push depending on the previous token.
    """
    torch.manual_seed(0)
    cfg = OmegaConf.create(
        {
            "embed_dim": 16,
            "dropout": 0.0,
            "tie_embeddings": False,
            "encoder": OmegaConf.load(CONFIGS / f"model/encoder/{encoder}.yaml"),
            "decoder": OmegaConf.load(CONFIGS / f"model/decoder/{decoder}.yaml"),
            "attention": OmegaConf.load(CONFIGS / "model/attention"
                                        / f"{'additive' if scorer == '-' else scorer}.yaml"),
        }
    )
    for node, hidden_size in ((cfg.encoder, 8), (cfg.decoder, 16)):
        if "transformer" in node._target_:
            node.update(num_heads=2, num_layers=2, ffn_dim=32)
        else:
            node.hidden_size = hidden_size
    if scorer == "multihead":
        cfg.attention.heads = 2
    model_cfg = OmegaConf.create({"model": cfg}).model  # resolves the ${model.*} interpolations
    model = build_model(model_cfg, src_vocab_size=VOCAB, tgt_vocab_size=VOCAB).eval()
    with torch.no_grad():
        # A flatter output layer gives many near-competitive continuations (a harder test).
        model.generator.weight.mul_(3.0)
        model.decoder.embedding.weight.mul_(3.0)
        model.generator.bias[EOS_ID] += eos_bias
    if table_seed is None:
        return model
    table = torch.randn(VOCAB, generator=torch.Generator().manual_seed(table_seed)) * 4
    return EosAfterToken(model, table)


def random_sources(batch_size: int, *, max_len: int = 7, seed: int = 1):
    """Padded random sources ending in EOS over this module's vocabulary."""
    return padded_random_sources(batch_size, vocab=VOCAB, max_len=max_len, seed=seed)


def unpadded(src: torch.Tensor, src_lengths: torch.Tensor, rows: list[int]):
    """The given rows as their own batch, padded only to their own longest length."""
    width = int(src_lengths[rows].max())
    return src[rows, :width], src_lengths[rows]


def assert_same_hypotheses(first: list[Hypothesis], second: list[Hypothesis]) -> None:
    assert [h.tokens for h in first] == [h.tokens for h in second]
    for a, b in zip(first, second, strict=True):
        assert a.score == pytest.approx(b.score, abs=1e-5)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_beam_size_one_is_greedy(architecture, alpha):
    model = tiny_model(*architecture, eos_bias=-3.0)
    src, src_lengths = random_sources(8)
    options = {"max_len_a": 1.0, "max_len_b": 3, "return_attention": True}
    greedy = greedy_search(model, src, src_lengths, length_penalty=alpha, **options)
    beam = beam_search(model, src, src_lengths, beam_size=1, length_penalty=alpha, **options)
    assert len({len(h[0].tokens) for h in greedy}) > 1  # some stop early, some at the limit
    for greedy_hypotheses, beam_hypotheses in zip(greedy, beam, strict=True):
        assert_same_hypotheses(greedy_hypotheses, beam_hypotheses)
        torch.testing.assert_close(greedy_hypotheses[0].attention, beam_hypotheses[0].attention)


class BigramModel:
    """A fake model whose next-token distribution depends only on the previous token.

    After BOS: A (0.6) or B (0.4). After A: EOS 0.2, every other word 0.8 / 6 (greedy's
    trap). After B, or any other word: EOS 0.99. So greedy says "A" (probability 0.12) while
    the best output is "B" (probability 0.396).
    """

    vocab_size = 10
    word_a, word_b = 4, 5

    def __init__(self) -> None:
        probs = torch.full((self.vocab_size, self.vocab_size), 1e-9)
        probs[BOS_ID, self.word_a], probs[BOS_ID, self.word_b] = 0.6, 0.4
        probs[self.word_a, 4:] = 0.8 / 6
        probs[self.word_a, EOS_ID] = 0.2
        probs[5:, EOS_ID] = 0.99
        probs[5:, 4] = 0.01
        probs[EOS_ID, EOS_ID] = 1.0
        self.log_probs = probs.log()

    def encode(self, src, src_lengths):
        mask = torch.arange(src.size(1)).unsqueeze(0) < src_lengths.unsqueeze(1)  # (B, S)
        memory = mask.unsqueeze(-1).float()  # (B, S, 1)
        return EncodedSource(memory=memory, mask=mask, final=memory[:, 0], keys=memory)

    def init_state(self, encoded):
        return {"steps": torch.zeros(encoded.final.size(0), 1)}

    def decode_step(self, prev_tokens, state, encoded):
        weights = encoded.mask.float() / encoded.mask.sum(1, keepdim=True)  # (B, S) uniform
        return self.log_probs[prev_tokens], weights, {"steps": state["steps"] + 1}


def test_beam_search_beats_greedy_where_greedy_is_wrong():
    model = BigramModel()
    src, src_lengths = torch.tensor([[7, EOS_ID]]), torch.tensor([2])
    options = {"max_len_a": 0.0, "max_len_b": 5, "length_penalty": 0.0}
    greedy = greedy_search(model, src, src_lengths, **options)[0][0]
    beam = beam_search(model, src, src_lengths, beam_size=2, **options)[0][0]
    assert greedy.tokens == [model.word_a]
    assert beam.tokens == [model.word_b]
    assert beam.score == pytest.approx(math.log(0.4) + math.log(0.99), abs=1e-5)
    assert beam.score > greedy.score


def test_length_penalty_is_gnmt_and_divides_the_summed_log_prob():
    model = BigramModel()
    src, src_lengths = torch.tensor([[7, EOS_ID]]), torch.tensor([2])
    best = beam_search(
        model, src, src_lengths, beam_size=2, length_penalty=0.6, max_len_a=0.0, max_len_b=5
    )[0][0]
    log_prob = math.log(0.4) + math.log(0.99)  # "B" then EOS: length 2 with the EOS
    assert best.score == pytest.approx(log_prob / ((5 + 2) / 6) ** 0.6, abs=1e-5)
    assert length_penalty_factor(10, 0.0) == 1.0


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_batched_equals_one_by_one_whatever_the_companions(architecture, search):
    model = tiny_model(*architecture, eos_bias=-3.0)
    src, src_lengths = random_sources(7, seed=3)

    def run(rows: list[int]):
        batch_src, batch_lengths = unpadded(src, src_lengths, rows)
        options = {"max_len_a": 1.0, "max_len_b": 4}
        if search == "greedy":
            return greedy_search(model, batch_src, batch_lengths, **options)
        return beam_search(model, batch_src, batch_lengths, beam_size=3, nbest=2, **options)

    everything = run(list(range(7)))
    shuffled_rows = [5, 2, 6, 0, 3]
    shuffled = run(shuffled_rows)
    for row in range(7):
        assert_same_hypotheses(run([row])[0], everything[row])
    for position, row in enumerate(shuffled_rows):
        assert_same_hypotheses(shuffled[position], everything[row])


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_nbest_is_sorted_and_distinct(architecture):
    model = tiny_model(*architecture, eos_bias=-3.0)
    src, src_lengths = random_sources(5, seed=4)
    results = beam_search(model, src, src_lengths, beam_size=4, nbest=4, max_len_a=1.0, max_len_b=3)
    for hypotheses in results:
        assert len(hypotheses) == 4
        scores = [h.score for h in hypotheses]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hypotheses}) == 4
        assert all(math.isfinite(score) for score in scores)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_max_length_is_respected(search):
    model = tiny_model(*ARCHITECTURES[0][:3], eos_bias=-50.0)  # never wants to stop
    src, src_lengths = random_sources(6, seed=5)
    options = {"max_len_a": 0.5, "max_len_b": 1, "return_attention": True}
    if search == "greedy":
        results = greedy_search(model, src, src_lengths, **options)
    else:
        results = beam_search(model, src, src_lengths, beam_size=3, nbest=3, **options)
    limits = max_output_lengths(src_lengths, max_len_a=0.5, max_len_b=1)
    rows = zip(results, limits.tolist(), src_lengths.tolist(), strict=True)
    for hypotheses, limit, source_len in rows:
        assert limit == math.floor(0.5 * source_len + 1)
        for hypothesis in hypotheses:
            assert len(hypothesis.tokens) == limit  # EOS forced right at the limit
            assert hypothesis.attention.shape == (limit + 1, source_len)
            torch.testing.assert_close(
                hypothesis.attention.sum(-1), torch.ones(limit + 1), atol=1e-5, rtol=0
            )
            assert not {PAD_ID, BOS_ID, EOS_ID} & set(hypothesis.tokens)


def test_zero_length_limit_gives_empty_outputs():
    model = tiny_model(*ARCHITECTURES[0][:3])
    src, src_lengths = random_sources(3)
    for results in (
        greedy_search(model, src, src_lengths, max_len_a=0, max_len_b=0),
        beam_search(model, src, src_lengths, beam_size=3, max_len_a=0, max_len_b=0),
    ):
        assert [h[0].tokens for h in results] == [[], [], []]


def test_no_row_forced_before_the_smallest_length_limit_or_after_the_prefixes():
    max_lengths = torch.tensor([4, 2, 6])
    sentences = torch.arange(3)
    first_forced_step = int(max_lengths.min())
    for step in range(first_forced_step):
        assert forced_tokens(step, max_lengths, first_forced_step, None, sentences) is None
    for step in range(first_forced_step, 8):
        forced = forced_tokens(step, max_lengths, first_forced_step, None, sentences)
        assert forced.tolist() == [EOS_ID if limit <= step else -1 for limit in max_lengths]
    prefixes = pad_prefixes([[7], [], [5, 6]], "cpu")
    assert prefixes.tolist() == [[7, -1], [-1, -1], [5, 6]]
    assert pad_prefixes([[], []], "cpu") is None
    assert forced_tokens(0, max_lengths, 2, prefixes, sentences).tolist() == [7, -1, 5]
    assert forced_tokens(1, max_lengths, 2, prefixes, sentences).tolist() == [-1, -1, 6]
    assert forced_tokens(1, max_lengths, 2, prefixes, torch.tensor([2])).tolist() == [6]
    assert forced_tokens(2, max_lengths, 2, prefixes, sentences).tolist() == [-1, EOS_ID, -1]
    # Skipping the mask gives the log-probabilities that masking no row gives.
    logits = torch.randn(3, 9)
    unforced = next_token_log_probs(logits, None)
    masked = next_token_log_probs(logits, torch.full((3,), -1))
    torch.testing.assert_close(unforced, masked, rtol=0, atol=0)
    forced = next_token_log_probs(logits, torch.tensor([-1, EOS_ID, 6]))
    assert torch.isinf(forced[1]).sum() == 8 and forced[1, EOS_ID] == unforced[1, EOS_ID]
    assert torch.isinf(forced[2]).sum() == 8 and forced[2, 6] == unforced[2, 6]
    torch.testing.assert_close(forced[0], unforced[0], rtol=0, atol=0)


def test_a_forced_prefix_starts_every_hypothesis_and_is_scored_by_the_model():
    """Greedy and beam keep each sentence's prefix (one sentence none, one longer than its
    length limit, which then grows to hold it); a prefix the model would have chosen anyway
    changes nothing; an ensemble and batching do not change it."""
    model = tiny_model("gru", "bahdanau", "additive", table_seed=3)
    src, src_lengths = random_sources(4, seed=3)
    options = {"max_len_a": 0.5, "max_len_b": 1}
    wanted = [[5, 6], [], [7, 8, 9, 10, 11, 12, 13, 14, 15, 4, 5], [4]]
    prefixes = pad_prefixes(wanted, "cpu")
    for search, extra in ((greedy_search, {}), (beam_search, {"beam_size": 3, "nbest": 2})):
        results = search(model, src, src_lengths, prefixes=prefixes, **options, **extra)
        for prefix, n_best in zip(wanted, results, strict=True):
            assert all(h.tokens[: len(prefix)] == prefix for h in n_best)
        alone = search(model, src[2:3], src_lengths[2:3], prefixes=prefixes[2:3], **options,
                       **extra)
        assert [h.tokens for h in alone[0]] == [h.tokens for h in results[2]]
    free = greedy_search(model, src, src_lengths, **options)
    chosen = pad_prefixes([h[0].tokens[:2] for h in free], "cpu")
    again = greedy_search(model, src, src_lengths, prefixes=chosen, **options)
    assert [(h[0].tokens, round(h[0].score, 4)) for h in again] == \
        [(h[0].tokens, round(h[0].score, 4)) for h in free]


class WantsLength:
    """Wraps a model and pushes EOS up, more at each step, once a sentence has as many tokens
    as it "wants".

    The wanted length is its first source id mod 13 (0..12), so some sentences stop early on
    their own (at different steps) and others run into their length limit. The wanted length
    and the step count live in the decoder state: they must follow the sentence's rows like
    the rest of it.
    """

    def __init__(self, model) -> None:
        self.model = model

    def encode(self, src, src_lengths):
        self.wanted = src[:, 0] % 13  # (B,)
        return self.model.encode(src, src_lengths)

    def init_state(self, encoded):
        state = self.model.init_state(encoded)
        return {**state, "wanted": self.wanted, "steps": torch.zeros_like(self.wanted)}

    def decode_step(self, prev_tokens, state, encoded):
        wanted, steps = state["wanted"], state["steps"]
        inner = {name: value for name, value in state.items() if name not in ("wanted", "steps")}
        logits, weights, inner = self.model.decode_step(prev_tokens, inner, encoded)
        logits = logits.clone()
        logits[:, EOS_ID] += 2.0 * (steps + 1 - wanted).clamp(min=0)
        return logits, weights, {**inner, "wanted": wanted, "steps": steps + 1}


class RowRecorder:
    """Wraps a model and records the beam slots of each decoder step (sentences x ``beams``),
    after checking that every state entry and the encoded source have the step's rows:
    ``beams`` rows a sentence, but one at the first step (only beam 0 is live)."""

    def __init__(self, model, beams: int) -> None:
        self.model, self.beams, self.rows = model, beams, []

    def encode(self, src, src_lengths):
        return self.model.encode(src, src_lengths)

    def init_state(self, encoded):
        return self.model.init_state(encoded)

    def decode_step(self, prev_tokens, state, encoded):
        rows = prev_tokens.numel()
        beams = self.beams if self.rows else 1  # the first step: one row per sentence
        assert all(value.size(0) == rows for value in state.values())
        assert all(value.size(0) == rows for value in encoded)
        self.rows.append(rows * self.beams // beams)
        return self.model.decode_step(prev_tokens, state, encoded)


def assert_same_with_attention(first: list[Hypothesis], second: list[Hypothesis]) -> None:
    assert_same_hypotheses(first, second)
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a.attention, b.attention, atol=1e-5, rtol=1e-5)


PRUNING_SEARCHES = {
    "greedy": {},
    "beam4-nbest3": {"beam_size": 4, "nbest": 3},
    "beam3-alpha0": {"beam_size": 3, "nbest": 1, "length_penalty": 0.0},
}


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("search", PRUNING_SEARCHES)
def test_finished_sentences_leave_the_batch_and_change_nothing(architecture, search, monkeypatch):
    model = WantsLength(tiny_model(*architecture, eos_bias=-5.0))
    src, src_lengths = random_sources(12, max_len=10, seed=7)
    options = {"max_len_a": 1.0, "max_len_b": 2, "return_attention": True}
    options.update(PRUNING_SEARCHES[search])
    beams = options.get("beam_size", 1)
    default_fraction = search_module.PRUNE_FRACTION

    def run(model, src, src_lengths, prune_fraction: float):
        monkeypatch.setattr(search_module, "PRUNE_FRACTION", prune_fraction)
        if search == "greedy":
            return greedy_search(model, src, src_lengths, **options)
        return beam_search(model, src, src_lengths, **options)

    recorder = RowRecorder(model, beams)
    pruned = run(recorder, src, src_lengths, 0.0)  # every finished sentence leaves at once
    unpruned_recorder = RowRecorder(model, beams)
    unpruned = run(unpruned_recorder, src, src_lengths, math.inf)  # as before: nobody leaves
    default = run(model, src, src_lengths, default_fraction)

    # The batch mixes outputs of very different lengths, some cut by the length limit...
    limits = max_output_lengths(src_lengths, max_len_a=1.0, max_len_b=2).tolist()
    best_lengths = [len(hypotheses[0].tokens) for hypotheses in pruned]
    assert len(set(best_lengths)) >= 5
    assert sum(length == limit for length, limit in zip(best_lengths, limits, strict=True)) >= 2
    assert sum(length < limit for length, limit in zip(best_lengths, limits, strict=True)) >= 3
    # ...and the sentences left it at several different steps, K beams each.
    assert unpruned_recorder.rows == [12 * beams] * len(unpruned_recorder.rows)
    assert recorder.rows[0] == 12 * beams and all(rows % beams == 0 for rows in recorder.rows)
    assert recorder.rows == sorted(recorder.rows, reverse=True)
    assert len(set(recorder.rows)) >= 5
    assert sum(recorder.rows) < 0.8 * sum(unpruned_recorder.rows)
    if search == "greedy":  # step t runs exactly the sentences whose output is still going
        steps = max(best_lengths) + 1
        assert recorder.rows == [sum(n + 1 > t for n in best_lengths) for t in range(steps)]

    alone_steps = []
    for row in range(12):
        alone_recorder = RowRecorder(model, beams)  # a batch of 1 cannot prune
        alone = run(alone_recorder, *unpadded(src, src_lengths, [row]), 0.0)[0]
        alone_steps.append(len(alone_recorder.rows))
        assert_same_with_attention(pruned[row], alone)
        assert_same_with_attention(pruned[row], unpruned[row])
        assert_same_with_attention(pruned[row], default[row])
        if search == "beam4-nbest3":
            assert len(pruned[row]) == 3
    # Each sentence left the batch right after the step at which it stops when searched alone.
    expected_rows = [
        beams * sum(steps > t for steps in alone_steps) for t in range(max(alone_steps))
    ]
    assert recorder.rows == expected_rows


def test_full_history_scatters_each_step_to_its_sentences():
    # Sentences 0..3; sentence 2 leaves after step 0, sentences 0 and 3 after step 1.
    segments = [
        (0, torch.tensor([0, 1, 2, 3])),
        (1, torch.tensor([0, 1, 3])),
        (2, torch.tensor([1])),
    ]
    per_step = [torch.tensor([10, 11, 12, 13]), torch.tensor([20, 21, 23]), torch.tensor([31])]
    index = history_index(segments, steps=3, batch_size=4)
    history = full_history(per_step, index, batch_size=4, fill=-1)
    expected = torch.tensor([[10, 11, 12, 13], [20, 21, -1, 23], [-1, 31, -1, -1]])
    torch.testing.assert_close(history, expected)
    pairs = [value.unsqueeze(1).repeat(1, 2) for value in per_step]  # trailing dimensions follow
    torch.testing.assert_close(
        full_history(pairs, index, batch_size=4, fill=-1), expected.unsqueeze(2).repeat(1, 1, 2)
    )


def test_encoded_source_is_cast_once_for_autocast():
    from seq2seq.inference.ensemble import EnsembleEncoded

    memory = torch.randn(2, 3, 4)
    encoded = EncodedSource(memory=memory, mask=torch.ones(2, 3, dtype=torch.bool),
                            final=torch.randn(2, 4), keys=memory)
    assert in_autocast_dtype(encoded, "cpu") is encoded  # no autocast: unchanged
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = in_autocast_dtype(encoded, "cpu")
        members = in_autocast_dtype(EnsembleEncoded([encoded, encoded]), "cpu")
    assert cast.memory.dtype == torch.bfloat16 and cast.keys is cast.memory
    assert cast.mask.dtype == torch.bool and cast.final.dtype == torch.float32
    assert isinstance(members, EnsembleEncoded)
    assert all(member.memory.dtype == torch.bfloat16 for member in members)
    projected = encoded._replace(keys=torch.randn(2, 3, 5))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = in_autocast_dtype(projected, "cpu")
    assert cast.keys is projected.keys  # a scorer's own precomputed keys are left alone


@torch.inference_mode()
def teacher_forced_score(model, src, src_lengths, tokens: list[int], alpha: float) -> float:
    """The model's own log-probability of ``tokens`` then EOS after one source sentence,
    summed step by step outside any search, divided by the length penalty."""
    encoded = model.encode(src, src_lengths)
    state = model.init_state(encoded)
    total, previous = 0.0, BOS_ID
    for token in [*tokens, EOS_ID]:
        logits, _, state = model.decode_step(torch.tensor([previous]), state, encoded)
        total += float(torch.log_softmax(logits.double(), dim=-1)[0, token])
        previous = token
    return total / length_penalty_factor(len(tokens) + 1.0, alpha)


@pytest.mark.parametrize("architecture", [ARCHITECTURES[0], ARCHITECTURES[2]])
@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_every_score_is_the_models_teacher_forced_log_probability(architecture, alpha):
    """Greedy, beam, sampling and the grid of constraints (beam 1 and 5), beside prefixes and
    the length limit's forced EOS: each hypothesis' score is what the model gives its tokens."""
    from seq2seq.inference.constraints import Grid
    from seq2seq.inference.decode_options import DecodeOptions
    from seq2seq.inference.sampling import sample_search
    from seq2seq.inference.search_loop import run_search

    model = tiny_model(*architecture[:3], table_seed=architecture[3])
    src, src_lengths = random_sources(4, seed=11)
    options = {"max_len_a": 1.0, "max_len_b": 2, "length_penalty": alpha,
               "prefixes": pad_prefixes([[6], [], [9, 4], []], "cpu")}
    constraints = [[[5, 6]], [], [[7], [8, 10]], [[12]]]
    searches = {
        "greedy": greedy_search(model, src, src_lengths, **options),
        "beam": beam_search(model, src, src_lengths, beam_size=5, nbest=3, **options),
        "sample": sample_search(model, src, src_lengths,
                                DecodeOptions(search="sample", temperature=2.0, nbest=2),
                                generator=torch.Generator().manual_seed(0), **options),
        **{f"grid{k}": run_search(model, src, src_lengths, Grid(constraints, k, src.device),
                                  nbest=min(k, 2), **options)
           for k in (1, 5)},
    }
    # Each sentence's length limit, raised to its prefix (the grid's also holds its phrases).
    limits = torch.maximum(max_output_lengths(src_lengths, max_len_a=1.0, max_len_b=2),
                           (options["prefixes"] >= 0).sum(dim=1)).tolist()
    ended = set()  # "limit": EOS forced at the limit; "chosen": EOS chosen before it
    for name, results in searches.items():
        for row, n_best in enumerate(results):
            assert n_best, name
            width = int(src_lengths[row])
            for hypothesis in n_best:
                if not name.startswith("grid"):
                    ended.add("limit" if len(hypothesis.tokens) == limits[row] else "chosen")
                expected = teacher_forced_score(model, src[row: row + 1, :width],
                                                src_lengths[row: row + 1], hypothesis.tokens, alpha)
                assert hypothesis.score == pytest.approx(expected, abs=1e-4), (name, row)
    assert ended == {"limit", "chosen"}  # both kinds of ending were scored
