"""A CTranslate2 folder (``seq2seq-export ... format=ctranslate2``) behind the Translator's interface.

:class:`CTranslate2Translator` offers what ``translate.py``, ``evaluate.py`` and ``serve.py`` call
on a :class:`~seq2seq.inference.translator.Translator` (``translate``, ``translate_ids``,
``target_ids`` and the decoding options as attributes), and
:func:`~seq2seq.inference.runtimes.translator_from_payloads` builds one for a CTranslate2 folder.
CTranslate2 runs the search; everything around it is ours:

- Tokenization and detokenization: the folder's sentencepiece model(s), as for a checkpoint.
  CTranslate2 gets and returns piece strings, which are the pieces of our ids (its vocabularies
  were written from our tokenizers, in id order), so a translation decodes through the same
  ``tokenizers.tgt.decode`` as the Translator's.
- Sources: cut to ``max_source_length`` pieces with a warning, EOS appended (by CTranslate2:
  the folder's ``add_source_eos``); an empty source gets an empty translation without a search.
- Output length limit: ``floor(max_len_a * n + max_len_b)`` pieces, EOS not counted (``n``: the
  source's pieces and its EOS), raised to a forced prefix's length. CTranslate2 takes one
  ``max_decoding_length`` a call, so a batch of sources sorted by length runs under the
  longest limit among them, and a sentence whose search had not ended a step before its own
  limit runs again under it (:meth:`_decode`; the steps of a search, not of a random draw,
  before a limit's last step do not depend on the limit; a sample with a shorter limit is
  always drawn again). CTranslate2 ends a hypothesis at its limit without an EOS step where
  our searches force one; such a hypothesis is finished here by one more step over it
  (:meth:`_finish_at_limit`), which gives its EOS log-probability and its EOS row of
  attention.
- Never generated: ``<pad>`` and ``<s>`` (``suppress_sequences``). CTranslate2 removes them
  before its softmax where our searches do after, so its log-probabilities are renormalized over
  the other pieces: a trained model gives those two pieces almost no probability, a random one
  does not (its greedy outputs are the same; its scores differ a little).
- Scores: the summed log-probabilities, EOS included, divided by our GNMT length penalty
  ``((5 + length) / 6) ** alpha``. CTranslate2's own divides by ``length ** alpha``, so alpha
  is not passed on: beam search runs CTranslate2 with a tiny penalty of its own
  (:data:`BEAM_LENGTH_PENALTY`: it then stops as ours does, once ``beam_size`` hypotheses have
  finished), asks for every finished hypothesis (``num_hypotheses=beam_size``) and ranks them
  here; its beams follow the summed log-probabilities, as ours do. A forced prefix's pieces
  score 0 in CTranslate2; their log-probabilities are added from one ``score_batch`` call.
- Sampling: ``temperature``, ``top_k`` and ``top_p`` are CTranslate2's own (it applies them in
  the same order, to the same distribution). With a ``seed``, each ``translate`` call draws from a
  new CTranslate2 worker seeded with it (the folder is loaded again for the call), so the same
  input and options give the same samples. ``epsilon`` has no CTranslate2 counterpart and is
  refused.
- Attention: what CTranslate2 returns, its alignment head (for a folder written by
  ``seq2seq-export``, the last decoder layer's first head, where a checkpoint shows the mean of
  every layer and head), with the source EOS column it leaves out restored (a row sums to 1);
  the first step's row from a one-step greedy call where beam search gets it wrong
  (:meth:`_first_attention_rows`). No per-layer and per-head matrices (``attention_heads``).

Refused in one line, each naming the option: phrases (``constraints``, ``terms``: CTranslate2
cannot force them), a ``shortlist``, ``epsilon``, a precision other than fp32 (the folder runs
in its exported types), ``quantize=int8`` for a float folder, a device other than the CPU, and
lengths past the folder's position table.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from seq2seq.checkpoint import CheckpointError, tokenizers_from_payload
from seq2seq.config_types import error_reason
from seq2seq.data.batching import cut_sorted
from seq2seq.data.corpus import DataError
from seq2seq.data.vocab import BOS_PIECE, EOS_ID, EOS_PIECE, PAD_PIECE, UNK_ID
from seq2seq.inference.sampling import Sampling
from seq2seq.inference.search import Hypothesis, length_penalty_factor
from seq2seq.inference.translator import (
    Translation,
    check_quantize_mode,
    check_translator_options,
    encode_targets,
    to_translations,
)

logger = logging.getLogger(__name__)

# Our searches never generate these; CTranslate2 is told the same.
NEVER_GENERATED = [[PAD_PIECE], [BOS_PIECE]]
PHRASE_REFUSAL = ("a CTranslate2 folder cannot force phrases: use the checkpoint or an ONNX "
                  "export")
# The length penalty beam search runs CTranslate2 with; our GNMT penalty ranks afterwards.
# Non-zero, so that CTranslate2 stops as ours does, once beam_size hypotheses have finished
# (with 0 it stops once the best beam has); so small that when more than beam_size finish at
# one step, the beam_size it keeps are the best by summed log-probability (a tiny trained
# Transformer, 300 sentences, beam 5: the best translation ours in 300 of 300 at every alpha
# of 0, 0.6 and 1, where a penalty of 1 kept the wrong ones in 9 to 37). A score times
# length ** it is the summed log-probability again.
BEAM_LENGTH_PENALTY = 1e-3
# ctranslate2.set_random_seed's "no seed" (its threads then seed from std::random_device).
UNSEEDED = 2**32 - 1
ATTENTION_SOURCE = ("CTranslate2's alignment head: the last decoder layer's first head (a "
                    "CTranslate2 folder gives no other layer or head)")


class CTranslate2Sampling(Sampling):
    """:class:`~seq2seq.inference.sampling.Sampling` with the options CTranslate2 has: its
    ``check`` also refuses ``epsilon`` (the server checks a request's settings with it)."""

    __slots__ = ()

    def check(self) -> CTranslate2Sampling:
        super().check()
        if self.epsilon > 0:
            raise ValueError(f"epsilon={self.epsilon}: a CTranslate2 folder samples with "
                             "temperature, top_k and top_p only: give epsilon=0")
        return self


class _Found(NamedTuple):
    """One hypothesis as CTranslate2 gave it, in our ids.

    Attributes:
        tokens: the output ids, without EOS (a forced prefix included).
        log_prob: its summed log-probability so far (EOS included once ``ended``).
        ended: whether it ends with an EOS step; False: cut at the length limit.
        attention: one row per step (len(tokens) + 1 once ended), over the source pieces
            without their EOS; None when not asked for.
    """

    tokens: list[int]
    log_prob: float
    ended: bool
    attention: list[list[float]] | None


def _with_eos_column(rows: list[list[float]]) -> torch.Tensor:
    """CTranslate2's attention rows with the source EOS column it leaves out: what each row
    gives the other pieces, subtracted from 1.

    Shape:
        - rows: (T + 1) rows of S weights; output: (T + 1, S + 1)
    """
    weights = np.asarray(rows, dtype=np.float32).reshape(len(rows), -1)
    eos = np.clip(1.0 - weights.sum(axis=1, keepdims=True), 0.0, 1.0)
    return torch.from_numpy(np.concatenate([weights, eos], axis=1))


def _ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise CheckpointError(
            "decoding a CTranslate2 folder needs CTranslate2: pip install '.[export]'") from None
    return ctranslate2


class CTranslate2Translator:
    """Translates with a CTranslate2 folder; the Translator's interface (see the module
    docstring for what maps and what is refused).

    Args:
        folder: the folder written by ``seq2seq-export ... format=ctranslate2``.
        manifest: its manifest (:func:`~seq2seq.inference.loading.read_manifest`).
        tokenizers: its :class:`~seq2seq.data.tokenizer.Tokenizers`.
        device: ``cpu`` or ``auto`` (the CPU); CTranslate2 runs on the CPU here.
        num_threads: CTranslate2's threads (``intra_threads``); None: ``torch.get_num_threads()``,
            which the ``num_threads`` option of the command-line tools sets.
        others: as for :class:`~seq2seq.inference.translator.Translator`.

    Raises:
        ValueError: naming the option, for one out of range or one CTranslate2 cannot honour.
        CheckpointError: when CTranslate2 is not installed or cannot load the folder.
    """

    # What the searches cannot do here, for callers that check before decoding.
    phrase_refusal = PHRASE_REFUSAL
    attention_source = ATTENTION_SOURCE

    def __init__(
        self,
        folder: str | os.PathLike,
        manifest: dict[str, Any],
        tokenizers,
        *,
        device: str | torch.device = "cpu",
        beam_size: int = 5,
        length_penalty: float = 1.0,
        max_len_a: float = 1.5,
        max_len_b: float = 10,
        nbest: int = 1,
        max_tokens: int = 4000,
        max_source_length: int = 250,
        precision: str = "fp32",
        quantize: str = "none",
        shortlist=None,
        search: str = "beam",
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        epsilon: float = 0.0,
        seed: int | None = None,
        num_threads: int | None = None,
    ) -> None:
        check_translator_options(search=search, beam_size=beam_size, nbest=nbest,
                                 max_tokens=max_tokens, max_source_length=max_source_length)
        self.sampling = CTranslate2Sampling(temperature=temperature, top_k=top_k, top_p=top_p,
                                            epsilon=epsilon).check()
        self.device = self._cpu(device)
        if precision not in ("fp32", "auto"):
            raise ValueError(
                f"precision={precision}: a CTranslate2 folder decodes in the types it was "
                "exported with (float32, or int8 weights with quantize=int8): give precision=fp32")
        if shortlist is not None:
            raise ValueError("shortlist: a CTranslate2 folder scores its whole target "
                             "vocabulary (a shortlist restricts our searches' output layer): "
                             "leave shortlist out")
        exported = manifest["export"]["quantize"]
        if check_quantize_mode(quantize) == "int8" and exported != "int8":
            raise ValueError(
                "quantize=int8 decodes a folder exported with quantize=int8: run seq2seq-export "
                "checkpoint=PATH output=DIR format=ctranslate2 quantize=int8, then give "
                "checkpoint=DIR")
        self.max_positions = int(manifest["export"]["max_positions"])
        longest_output = math.floor(max_len_a * (max_source_length + 1) + max_len_b)
        if max_source_length + 1 > self.max_positions:
            raise ValueError(
                f"max_source_length={max_source_length}: the CTranslate2 folder's position "
                f"table holds {self.max_positions} source positions, its EOS included: give "
                f"max_source_length={self.max_positions - 1} or less")
        if longest_output + 1 > self.max_positions:
            raise ValueError(
                f"max_len_a={max_len_a}, max_len_b={max_len_b}: a source of max_source_length="
                f"{max_source_length} pieces may get {longest_output} output pieces, past the "
                f"{self.max_positions - 1} the CTranslate2 folder's position table allows")
        self.folder = Path(folder)
        self.manifest = manifest
        self.tokenizers = tokenizers
        self.search = search
        self.seed = seed
        self.beam_size = beam_size
        self.length_penalty = length_penalty
        self.max_len_a = max_len_a
        self.max_len_b = max_len_b
        self.nbest = nbest
        self.max_tokens = max_tokens
        self.max_source_length = max_source_length
        self.precision = "fp32"  # the folder's types, int8 weights included (see quantize)
        self.autocast_dtype = None
        self.quantize = exported  # what runs, as reports read it, whatever was asked
        self.shortlist = None
        self.parameter_count = int(manifest["parameters"])
        self._ctranslate2 = _ctranslate2()
        self.num_threads = num_threads or torch.get_num_threads()
        self.engine = self._load_engine()
        tgt = tokenizers.tgt
        # CTranslate2's target vocabulary is our target pieces in id order.
        self._target_id = {tgt.id_to_piece(i): i for i in range(tgt.vocab_size)}

    def _load_engine(self):
        """A ``ctranslate2.Translator`` of the folder: one worker thread (ours call it one
        batch at a time), ``num_threads`` threads for its products."""
        try:
            return self._ctranslate2.Translator(str(self.folder), device="cpu", inter_threads=1,
                                                intra_threads=self.num_threads)
        except Exception as error:  # ctranslate2's own error types
            raise CheckpointError(f"CTranslate2 cannot load {self.folder}: "
                                  f"{error_reason(error)}") from None

    @contextmanager
    def _sampling_engine(self) -> Iterator[Any]:
        """The engine that draws the samples of one ``translate`` call: with a ``seed``, a new
        one. CTranslate2 seeds a thread's generator once, from the global seed, when the thread
        first samples, so only a new worker thread restarts the draws; the global seed is put
        back to unseeded (its ``random_device``) once the call is over."""
        if self.search != "sample" or self.seed is None:
            yield self.engine
            return
        self._ctranslate2.set_random_seed(self.seed % UNSEEDED)
        try:
            yield self._load_engine()
        finally:
            self._ctranslate2.set_random_seed(UNSEEDED)

    @staticmethod
    def _cpu(device: str | torch.device) -> torch.device:
        try:
            chosen = torch.device("cpu" if str(device) == "auto" else device)
        except RuntimeError:
            raise ValueError(f"unknown device {device!r}: use auto or cpu") from None
        if chosen.type != "cpu":
            raise ValueError(f"device={device}: a CTranslate2 folder decodes on the CPU here: "
                             "give device=cpu")
        return chosen

    @classmethod
    def from_payload(cls, payload: dict[str, Any], device: str | torch.device = "cpu",
                     **options) -> CTranslate2Translator:
        """The translator of a CTranslate2 folder read with
        :func:`~seq2seq.inference.loading.load_model_payload`."""
        exported = payload["exported"]
        return cls(exported["folder"], exported["manifest"],
                   tokenizers_from_payload(payload["tokenizers"]), device=device, **options)

    # -- ids ------------------------------------------------------------------------------
    def translate_ids(
        self, src_ids: Sequence[np.ndarray], *, return_attention: bool = False,
        progress: Callable[[int], object] | None = None,
        prefixes: Sequence[Sequence[int]] | None = None,
        constraints: Sequence[Sequence[Sequence[int]]] | None = None,
    ) -> list[list[Hypothesis]]:
        """As :meth:`Translator.translate_ids <seq2seq.inference.translator.Translator.translate_ids>`:
        per sentence, in input order, up to ``nbest`` hypotheses, best first.

        Raises:
            ValueError: for constraints (:data:`PHRASE_REFUSAL`), a count of prefixes other
                than the sentences', or a prefix past the position table.
        """
        sources = [self._cut(np.asarray(ids, dtype=np.int64).reshape(-1), i)
                   for i, ids in enumerate(src_ids)]
        for name, given in (("prefixes", prefixes), ("constraints", constraints)):
            if given is not None and len(given) != len(sources):
                raise ValueError(f"{len(sources)} sentences but {len(given)} {name}")
        if constraints is not None and any(constraints):
            raise ValueError(self.phrase_refusal)
        forced = [list(prefixes[i]) if prefixes is not None else [] for i in range(len(sources))]
        for number, prefix in enumerate(forced, start=1):
            if len(prefix) + 1 > self.max_positions:
                raise ValueError(f"sentence {number}: a prefix of {len(prefix)} pieces, past the "
                                 f"{self.max_positions - 1} the CTranslate2 folder's position "
                                 "table allows")
        results: list[list[Hypothesis] | None] = [None] * len(sources)
        for index, source in enumerate(sources):
            if source.size == 0:
                results[index] = [Hypothesis(tokens=[], score=0.0, attention=None)]
        if progress is not None:
            progress(sum(source.size == 0 for source in sources))
        limits = [self._limit(source, prefix) for source, prefix in zip(sources, forced,
                                                                       strict=True)]
        with self._sampling_engine() as engine:
            for batch in self._batches(sources):
                found = self._search([sources[i] for i in batch], [forced[i] for i in batch],
                                     [limits[i] for i in batch],
                                     return_attention=return_attention, engine=engine)
                for index, hypotheses in zip(batch, found, strict=True):
                    results[index] = hypotheses
                if progress is not None:
                    progress(len(batch))
        return results  # type: ignore[return-value]  # every slot is filled above

    def _cut(self, ids: np.ndarray, index: int) -> np.ndarray:
        if ids.size > self.max_source_length:
            logger.warning("source sentence %d has %d pieces: translating only its first %d "
                           "(max_source_length)", index + 1, ids.size, self.max_source_length)
            return ids[: self.max_source_length]
        return ids

    def _limit(self, source: np.ndarray, prefix: list[int]) -> int:
        """The output limit of one sentence, as our searches compute it (EOS not counted)."""
        limit = max(0, math.floor(self.max_len_a * (source.size + 1) + self.max_len_b))
        return max(limit, len(prefix))

    def _batches(self, sources: list[np.ndarray]) -> list[list[int]]:
        """The non-empty sources sorted by length, in batches cut to the token budget (their
        padded source, EOS included), longest first, whatever their output limits."""
        indices = sorted((i for i, source in enumerate(sources) if source.size > 0),
                         key=lambda i: sources[i].size)
        order = np.array(indices, dtype=np.int64)
        costs = np.array([sources[i].size + 1 for i in indices], dtype=np.int64)
        return [batch.tolist() for batch in reversed(cut_sorted(
            order, costs, max_tokens=self.max_tokens, max_sentences=max(order.size, 1)))]

    def _run(self, call: str, *args, engine=None, **options):
        """``engine.call(...)`` (default: the translator's own engine), its errors in one
        line."""
        try:
            return getattr(engine or self.engine, call)(*args, **options)
        except Exception as error:  # ctranslate2's own error types
            raise DataError(f"the CTranslate2 folder {self.folder} could not decode a batch: "
                            f"{error_reason(error)}") from None

    def _search(self, sources: list[np.ndarray], prefixes: list[list[int]], limits: list[int],
                *, return_attention: bool, engine) -> list[list[Hypothesis]]:
        """One batch of non-empty sources, each with its output limit: ``engine``'s search,
        then our scores, ranking and attention."""
        source_pieces = [self.tokenizers.src.pieces(source.tolist()) for source in sources]
        copies = self.nbest if self.search == "sample" else 1  # each sample its own row
        rows = [row for row in range(len(sources)) for _ in range(copies)]
        row_pieces = [source_pieces[row] for row in rows]
        row_limits = [limits[row] for row in rows]
        found = self._decode(row_pieces, [prefixes[row] for row in rows], row_limits,
                             return_attention=return_attention, engine=engine)
        found = self._finish_at_limit(found, row_pieces, row_limits,
                                      return_attention=return_attention)
        prefix_log_probs = self._prefix_log_probs(source_pieces, prefixes)
        per_sentence: list[list[Hypothesis]] = [[] for _ in sources]
        for row, hypotheses in zip(rows, found, strict=True):
            for hypothesis in hypotheses:
                log_prob = hypothesis.log_prob + prefix_log_probs[row]
                score = log_prob / length_penalty_factor(len(hypothesis.tokens) + 1.0,
                                                         self.length_penalty)
                attention = (None if hypothesis.attention is None
                             else _with_eos_column(hypothesis.attention))
                per_sentence[row].append(Hypothesis(hypothesis.tokens, float(score), attention))
        # Best first by our score (stable: CTranslate2's order among equals).
        return [sorted(hypotheses, key=lambda h: -h.score)[: self.nbest]
                for hypotheses in per_sentence]

    def _decode(self, source_pieces: list[list[str]], prefixes: list[list[int]],
                limits: list[int], *, return_attention: bool, engine) -> list[list[_Found]]:
        """Each row's hypotheses as its own limit gives them: one call under the longest
        limit, then one for each shorter limit whose rows had not ended in time.

        A search under a longer limit takes the same steps as under a row's own limit until
        that limit's last step, where CTranslate2 ends every beam. So a row stands when all its
        hypotheses ended (EOS) before that step: the search had stopped there, as it would have
        under its own limit (num_hypotheses = beam_size: at least one hypothesis kept ended at
        the step where the search stopped). Not for random samples: keeping only the draws that
        ended in time would favour short ones, so every shorter limit's rows are drawn again.
        """
        longest = max(limits)
        found = self._translate(source_pieces, prefixes, longest,
                                return_attention=return_attention, engine=engine)
        drawn = self.search == "sample"
        again: dict[int, list[int]] = {}
        for row, (hypotheses, limit) in enumerate(zip(found, limits, strict=True)):
            in_time = not drawn and all(h.ended and len(h.tokens) + 1 < limit
                                        for h in hypotheses)
            if limit < longest and not in_time:
                again.setdefault(limit, []).append(row)
        for limit, rows in again.items():
            redone = self._translate([source_pieces[row] for row in rows],
                                     [prefixes[row] for row in rows], limit,
                                     return_attention=return_attention, engine=engine)
            for row, hypotheses in zip(rows, redone, strict=True):
                found[row] = hypotheses
        return found

    def _translate(self, source_pieces: list[list[str]], prefixes: list[list[int]], limit: int,
                   *, return_attention: bool, engine) -> list[list[_Found]]:
        """The search over rows that share an output limit: one ``translate_batch`` call (and
        one more for the first attention rows of a beam search over several rows)."""
        if limit == 0:  # nothing to decode before the EOS step
            return [[_Found([], 0.0, False, [] if return_attention else None)]
                    for _ in source_pieces]
        beam = self.search == "beam" and self.beam_size > 1
        options: dict[str, Any] = {
            "beam_size": self.beam_size if beam else 1,
            "num_hypotheses": self.beam_size if beam else 1,
            "length_penalty": BEAM_LENGTH_PENALTY if beam else 0.0,
            "max_decoding_length": limit, "min_decoding_length": 0,
            "max_input_length": 0, "suppress_sequences": NEVER_GENERATED,
            "return_scores": True, "return_end_token": True,
            "return_attention": return_attention,
        }
        if self.search == "sample":
            top_k = self.sampling.top_k if self.sampling.top_k < len(self._target_id) else 0
            options.update(sampling_topk=top_k, sampling_topp=self.sampling.top_p,
                           sampling_temperature=self.sampling.temperature)
        target_prefix = ([self.tokenizers.tgt.pieces(prefix) for prefix in prefixes]
                         if any(prefixes) else None)
        results = self._run("translate_batch", source_pieces, target_prefix, engine=engine,
                            **options)
        found = [[self._found(pieces, score, attention, beam) for pieces, score, attention
                  in zip(result.hypotheses, result.scores,
                         result.attention or [None] * len(result.hypotheses), strict=True)]
                 for result in results]
        if beam and return_attention and len(source_pieces) > 1:
            found = self._first_attention_rows(found, source_pieces, engine=engine)
        return found

    def _first_attention_rows(self, found: list[list[_Found]], source_pieces: list[list[str]],
                              *, engine) -> list[list[_Found]]:
        """The first attention row of each hypothesis, from a one-step greedy call: in a batch
        of several sentences, CTranslate2's beam search (4.8, CPU) gives sentence i the first
        row of sentence i // beam_size (it expands the beams after that step and gathers its
        rows as if it had). The first step reads only BOS and the source, so it is the same
        for every hypothesis of a sentence, a prefix or not, and greedy search returns it
        right."""
        first = self._run("translate_batch", source_pieces, engine=engine, beam_size=1,
                          max_decoding_length=1, min_decoding_length=0, max_input_length=0,
                          return_end_token=True, return_attention=True)
        return [[h._replace(attention=[list(result.attention[0][0]), *h.attention[1:]])
                 if h.attention else h for h in hypotheses]
                for hypotheses, result in zip(found, first, strict=True)]

    def _found(self, pieces: list[str], score: float, attention, beam: bool) -> _Found:
        ended = bool(pieces) and pieces[-1] == EOS_PIECE
        tokens = [self._target_id.get(piece, UNK_ID) for piece in
                  (pieces[:-1] if ended else pieces)]
        # Beam search divided the sum by length ** BEAM_LENGTH_PENALTY, EOS counted.
        log_prob = score * len(pieces) ** BEAM_LENGTH_PENALTY if beam else score
        return _Found(tokens, float(log_prob), ended,
                      None if attention is None else [list(row) for row in attention])

    def _finish_at_limit(self, found: list[list[_Found]], source_pieces: list[list[str]],
                         limits: list[int], *, return_attention: bool) -> list[list[_Found]]:
        """Every hypothesis that reached its row's limit without EOS, finished as our searches
        do: one more step over it (its pieces forced) gives the EOS log-probability and the EOS
        step's attention row. One call for each limit such hypotheses reached."""
        cut_at: dict[int, list[tuple[int, int]]] = {}
        for row, hypotheses in enumerate(found):
            for rank, hypothesis in enumerate(hypotheses):
                if not hypothesis.ended:
                    cut_at.setdefault(limits[row], []).append((row, rank))
        finished = [list(hypotheses) for hypotheses in found]
        for limit, cut in cut_at.items():
            results = self._run(
                "translate_batch", [source_pieces[row] for row, _ in cut],
                [self.tokenizers.tgt.pieces(found[row][rank].tokens) for row, rank in cut],
                beam_size=1, max_decoding_length=limit + 1, min_decoding_length=0,
                max_input_length=0, suppress_sequences=NEVER_GENERATED, length_penalty=0.0,
                return_end_token=True,  # else an EOS step's attention row is dropped
                return_logits_vocab=True, return_attention=return_attention)
            for (row, rank), result in zip(cut, results, strict=True):
                logits = np.asarray(result.logits[0][-1], dtype=np.float64)  # the step after
                top = logits.max()
                eos_log_prob = logits[EOS_ID] - top - math.log(np.exp(logits - top).sum())
                hypothesis = finished[row][rank]
                attention = hypothesis.attention
                if return_attention:
                    attention = [*attention, list(result.attention[0][-1])]
                finished[row][rank] = hypothesis._replace(
                    log_prob=hypothesis.log_prob + float(eos_log_prob), ended=True,
                    attention=attention)
        return finished

    def _prefix_log_probs(self, source_pieces: list[list[str]],
                          prefixes: list[list[int]]) -> list[float]:
        """Per sentence, its forced prefix's log-probability (CTranslate2 scores a forced piece
        0; our searches count the model's log-probability): 0 without a prefix."""
        rows = [row for row, prefix in enumerate(prefixes) if prefix]
        sums = [0.0] * len(prefixes)
        if rows:
            results = self._run("score_batch", [source_pieces[row] for row in rows],
                                [self.tokenizers.tgt.pieces(prefixes[row]) for row in rows],
                                max_input_length=0)
            for row, result in zip(rows, results, strict=True):
                sums[row] = float(sum(result.log_probs[: len(prefixes[row])]))  # not its EOS
        return sums

    # -- text -----------------------------------------------------------------------------
    def target_ids(self, texts: Sequence[str], what: str) -> list[list[int]]:
        """Target piece ids of each text (:func:`~seq2seq.inference.translator.encode_targets`)."""
        return encode_targets(self.tokenizers.tgt, texts, what)

    def translate(
        self, sentences: Sequence[str], *, return_attention: bool = True,
        attention_heads: bool = False, progress: Callable[[int], object] | None = None,
        prefixes: Sequence[str] | None = None,
        constraints: Sequence[Sequence[str]] | None = None,
    ) -> list[list[Translation]]:
        """Translate sentences of raw text, as :meth:`Translator.translate
        <seq2seq.inference.translator.Translator.translate>` (``attention_heads`` gives none:
        CTranslate2 returns one attention matrix).

        Raises:
            ValueError: on constraints (:data:`PHRASE_REFUSAL`), or a prefix with a piece the
                target vocabulary lacks.
        """
        if constraints is not None and any(constraints):
            raise ValueError(self.phrase_refusal)
        src_ids = [np.asarray(ids, dtype=np.int64) for ids in self.tokenizers.src.encode(sentences)]
        results = self.translate_ids(
            src_ids, return_attention=return_attention, progress=progress,
            prefixes=None if prefixes is None else self.target_ids(prefixes, "prefix"))
        if not return_attention:
            results = [[h._replace(attention=None) for h in n_best] for n_best in results]
        return to_translations(self.tokenizers, src_ids, results, [None] * len(results),
                               max_source_length=self.max_source_length)
