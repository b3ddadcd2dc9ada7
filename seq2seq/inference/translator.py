"""Text in, text out: tokenize, batch by length, search, detokenize, restore the input order.

A translator (:func:`~seq2seq.inference.runtimes.load_translator` opens one) holds a model and
what goes with it (tokenizers, device, precision, batching budget); how to decode
(:class:`~seq2seq.inference.decode_options.DecodeOptions`) is passed with each call.
:class:`BaseTranslator` is the part every runtime shares: tokenization, the request's checks,
cutting long sources, batching, empty sentences, and the conversion to :class:`Translation` s.
A runtime supplies its search over one batch and declares what it cannot do
(:attr:`BaseTranslator.cannot`): :class:`Translator` drives PyTorch checkpoints, ONNX Runtime
folders and ensembles through our searches;
:class:`~seq2seq.inference.ctranslate2_translator.CTranslate2Translator` hands the search to
CTranslate2.

Decisions worth knowing:

- Sources are the sentence's pieces followed by EOS_ID, as in training.
- Sentences are sorted by length and cut into batches whose padded source
  (``sentences x (longest + 1)`` ids) fits ``max_tokens`` (:func:`~seq2seq.data.batching.cut_sorted`,
  as training's batches), longest batch first; the budget does not scale with the beam size.
  Results come back in input order.
- A sentence with no pieces (an empty or blank line) is not fed to the model: it gets one
  empty translation with score 0.0 and no attention. Running the model on a lone EOS would
  only invent a sentence that nothing in the input asked for.
- A source longer than ``max_source_length`` pieces is cut to its first
  ``max_source_length`` pieces (plus EOS) and a warning is logged; it is never dropped, so
  the output always has one entry per input.
- The search is the registered one ``options.search`` names
  (:mod:`seq2seq.inference.searches`), on any
  :class:`~seq2seq.models.interfaces.DecodingModel`: what differs between models (precisions,
  device, int8) each declares, and nothing here asks which class it holds.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from seq2seq.data.batching import collate, cut_sorted, pad_sources
from seq2seq.data.vocab import UNK_ID
from seq2seq.device import AUTOCAST_DTYPES, choose_precision, select_device
from seq2seq.inference.decode_options import DecodeOptions
from seq2seq.inference.decode_timing import decoding_workload
from seq2seq.inference.export_format import check_int8_decoding, check_quantize_mode
from seq2seq.inference.forcing import pad_prefixes
from seq2seq.inference.model_files import require_cpu
from seq2seq.inference.search_loop import Hypothesis
from seq2seq.inference.shortlist import Shortlist
from seq2seq.models.interfaces import PRECISIONS, DecodingModel
from seq2seq.precision import autocast

logger = logging.getLogger(__name__)

# What translate() decodes with unless given options: beam 5, one translation a sentence.
DEFAULT_OPTIONS = DecodeOptions()


class Translation(NamedTuple):
    """One translation of one input sentence.

    Attributes:
        text: the detokenized translation.
        score: the length-penalised log-probability the search ranked it by.
        source_pieces: the source pieces the model read (after any cut), without EOS.
        target_pieces: the output pieces, without EOS.
        attention: attention weights when requested, else None. Shape
            (len(target_pieces) + 1, len(source_pieces) + 1): the last row is the step that
            produced EOS, the last column the source's EOS.
        attention_heads: with ``attention_heads=True`` and a model that has heads to show (a
            Transformer), the best translation's every layer's and head's cross-attention,
            (L, H, T + 1, S + 1) like ``attention`` (which is their mean); else None.
    """

    text: str
    score: float
    source_pieces: list[str]
    target_pieces: list[str]
    attention: Tensor | None
    attention_heads: Tensor | None = None


@contextmanager
def eval_mode(model: DecodingModel) -> Iterator[None]:
    """Switch a model to eval mode and back to what it was (the trainer lends its model)."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        if was_training:
            model.train()


class BaseTranslator(ABC):
    """What every runtime's translator shares: text and piece ids in, n-best lists out.

    Args:
        tokenizers: the model's :class:`~seq2seq.data.tokenizer.Tokenizers`.
        max_tokens, max_source_length: the batches' budget and the cut (the module docstring).

    Attributes:
        searches: the registered searches the runtime runs (:mod:`seq2seq.inference.searches`);
            None: every one (the runtime decodes through our loop). Others are refused with
            ``cannot["search"]``.
        cannot: what the runtime cannot do, each with the one-line reason it is refused:
            ``search`` (one not in ``searches``), ``phrases`` (constraints, terms),
            ``epsilon`` (sampling's), and settings it is built with (``shortlist``,
            ``precision``, ``device``).
        differs: what it does differently from our searches where it does decode, one line
            each: the tools log them when they open it (:func:`~seq2seq.inference.runtimes.open_model`).
        attention_source: what its attention matrices show where they are not the model's
            own cross-attention (None: the model's own).
        model: the decodable model, where the runtime has one of ours (else None).
        tokenizers, device, precision, quantize, shortlist, parameter_count, max_tokens,
            max_source_length: what it decodes with, as reports read them.
    """

    searches: tuple[str, ...] | None = None
    cannot: Mapping[str, str] = {}
    differs: tuple[str, ...] = ()
    attention_source: str | None = None
    model: Any = None
    shortlist: Shortlist | None = None

    def __init__(self, tokenizers, *, max_tokens: int, max_source_length: int) -> None:
        for name, value in (("max_tokens", max_tokens), ("max_source_length", max_source_length)):
            if value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        self.tokenizers = tokenizers
        self.max_tokens = max_tokens
        self.max_source_length = max_source_length

    # -- what a runtime supplies ----------------------------------------------------------
    @abstractmethod
    def _decoding(self, options: DecodeOptions) -> AbstractContextManager[Any]:
        """What one call's batches are searched with (a seeded generator, an engine), set
        up for the call and put back after it."""

    @abstractmethod
    def _search(self, sources: list[np.ndarray], options: DecodeOptions, context: Any, *,
                return_attention: bool, prefixes: list[list[int]] | None,
                constraints: list[list[list[int]]] | None) -> list[list[Hypothesis]]:
        """One batch of non-empty sources searched: per source, up to ``options.nbest``
        hypotheses, best first (``context``: what :meth:`_decoding` gave)."""

    def _attention_heads(self, src_ids: list[np.ndarray],
                         results: list[list[Hypothesis]]) -> list[Tensor | None]:
        """Each sentence's best hypothesis' every layer's and head's attention; None where the
        runtime has none to show."""
        return [None] * len(results)

    # -- the request ----------------------------------------------------------------------
    def check(self, options: DecodeOptions, *, phrases: bool = False) -> None:
        """A one-line ValueError where ``options`` (and phrases, if asked for) ask what this
        runtime cannot do."""
        if self.searches is not None and options.search not in self.searches:
            raise ValueError(f"search={options.search}: " + self.cannot.get(
                "search", f"this runtime runs {', '.join(self.searches)} only"))
        if phrases:
            options.check_phrases()
            if "phrases" in self.cannot:
                raise ValueError(self.cannot["phrases"])
        if options.search_method.draws and options.epsilon > 0 and "epsilon" in self.cannot:
            raise ValueError(f"epsilon={options.epsilon}: {self.cannot['epsilon']}")

    # -- ids ------------------------------------------------------------------------------
    def translate_ids(
        self, src_ids: Sequence[np.ndarray], options: DecodeOptions | None = None, *,
        return_attention: bool = False, progress: Callable[[int], object] | None = None,
        prefixes: Sequence[Sequence[int]] | None = None,
        constraints: Sequence[Sequence[Sequence[int]]] | None = None,
    ) -> list[list[Hypothesis]]:
        """Translate sentences given as source piece ids (one 1-D array or list each, without
        EOS): per sentence, in input order, up to ``nbest`` hypotheses, best first.

        Args:
            progress: called with the number of sentences each batch translated (a progress
                bar's ``update``).
            prefixes: per sentence, the target ids every translation starts with.
            constraints: per sentence, target id phrases every translation contains
                (:mod:`seq2seq.inference.constraints`).

        Raises:
            ValueError: on counts of prefixes or constraints other than the sentences', or
                what :meth:`check` refuses.
        """
        options = options or DEFAULT_OPTIONS
        self.check(options, phrases=constraints is not None and any(constraints))
        sources = [
            self._cut(np.asarray(ids, dtype=np.int64).reshape(-1), i)
            for i, ids in enumerate(src_ids)
        ]
        for name, given in (("prefixes", prefixes), ("constraints", constraints)):
            if given is not None and len(given) != len(sources):
                raise ValueError(f"{len(sources)} sentences but {len(given)} {name}")
        results: list[list[Hypothesis] | None] = [
            [Hypothesis(tokens=[], score=0.0, attention=None)] if source.size == 0 else None
            for source in sources]
        if progress is not None:
            progress(sum(source.size == 0 for source in sources))
        banks = None if constraints is None else [
            1 + sum(len(phrase) for phrase in phrases) for phrases in constraints]
        with self._decoding(options) as context:
            for batch in self._batches(sources, banks):
                batch_results = self._search(
                    [sources[i] for i in batch], options, context,
                    return_attention=return_attention,
                    prefixes=None if prefixes is None else [list(prefixes[i]) for i in batch],
                    constraints=(None if constraints is None
                                 else [[list(p) for p in constraints[i]] for i in batch]),
                )
                for index, hypotheses in zip(batch, batch_results, strict=True):
                    results[index] = hypotheses
                if progress is not None:
                    progress(len(batch))
        return results  # type: ignore[return-value]  # every slot is filled above

    def _cut(self, ids: np.ndarray, index: int) -> np.ndarray:
        if ids.size > self.max_source_length:
            logger.warning(
                "source sentence %d has %d pieces: translating only its first %d "
                "(max_source_length)",
                index + 1,
                ids.size,
                self.max_source_length,
            )
            return ids[: self.max_source_length]
        return ids

    def _batches(self, sources: list[np.ndarray],
                 banks: list[int] | None = None) -> list[list[int]]:
        """Indices of the non-empty sources cut to the token budget (their padded source, EOS
        included), the batches of the longest first.

        With ``banks`` (per source, the grid beam search's banks: its constraint pieces + 1),
        sources are batched only with those of as many banks, since a batch is searched with
        its largest count for every sentence, and a source costs its padded length times its
        banks (the rows it takes)."""
        nonempty = [i for i, source in enumerate(sources) if source.size > 0]
        groups = {}
        for i in nonempty:
            groups.setdefault(1 if banks is None else banks[i], []).append(i)
        batches = []
        for count in sorted(groups, reverse=True):
            order = np.array(sorted(groups[count], key=lambda i: sources[i].size), dtype=np.int64)
            costs = np.array([(sources[i].size + 1) * count for i in order], dtype=np.int64)
            cut = cut_sorted(order, costs, max_tokens=self.max_tokens, max_sentences=order.size)
            batches += [batch.tolist() for batch in reversed(cut)]
        return batches

    # -- text -----------------------------------------------------------------------------
    def target_ids(self, texts: Sequence[str], what: str) -> list[list[int]]:
        """Target piece ids of each text, refusing one the model cannot write (a piece that
        encodes to <unk>): ``what`` names it in the one-line error (an empty text is refused
        unless it is a prefix)."""
        encoded = self.tokenizers.tgt.encode(list(texts)) if texts else []
        for text, ids in zip(texts, encoded, strict=True):
            if not ids and what != "prefix":
                raise ValueError(f"{what} {text!r} is empty")
            if UNK_ID in ids:
                raise ValueError(f"{what} {text!r} has a piece the model's target vocabulary "
                                 "lacks: it cannot be produced")
        return [list(ids) for ids in encoded]

    def translate(
        self, sentences: Sequence[str], options: DecodeOptions | None = None, *,
        return_attention: bool = True, attention_heads: bool = False,
        progress: Callable[[int], object] | None = None,
        prefixes: Sequence[str] | None = None,
        constraints: Sequence[Sequence[str]] | None = None,
    ) -> list[list[Translation]]:
        """Translate sentences of raw text (no line breaks inside): per sentence, in input
        order, up to ``nbest`` translations, best first; an empty or blank sentence gets one
        empty translation (score 0.0, no attention) whatever its prefix and constraints.

        Args:
            return_attention: keep the attention weights (a little slower; off for scoring).
            attention_heads: :attr:`Translation.attention_heads` too, where the model has them:
                one more teacher-forced pass.
            prefixes, constraints: as :meth:`translate_ids`'s, in text ("" for no prefix).

        Raises:
            ValueError: on a prefix or phrase with a piece the target vocabulary lacks, or
                what :meth:`check` refuses.
        """
        src_ids = [np.asarray(ids, dtype=np.int64) for ids in self.tokenizers.src.encode(sentences)]
        results = self.translate_ids(
            src_ids, options, return_attention=return_attention, progress=progress,
            prefixes=None if prefixes is None else self.target_ids(prefixes, "prefix"),
            constraints=None if constraints is None else [
                self.target_ids(phrases, f"sentence {number + 1}: constraint")
                for number, phrases in enumerate(constraints)],
        )
        heads = (self._attention_heads(src_ids, results) if attention_heads
                 else [None] * len(results))
        # Every hypothesis detokenized in one sentencepiece call.
        texts = iter(self.tokenizers.tgt.decode([h.tokens for n_best in results for h in n_best]))
        translations = []
        for ids, n_best, best_heads in zip(src_ids, results, heads, strict=True):
            source_pieces = self.tokenizers.src.pieces(ids[: self.max_source_length].tolist())
            translations.append([
                Translation(text=next(texts), score=hypothesis.score, source_pieces=source_pieces,
                            target_pieces=self.tokenizers.tgt.pieces(hypothesis.tokens),
                            attention=hypothesis.attention,
                            attention_heads=best_heads if rank == 0 else None)
                for rank, hypothesis in enumerate(n_best)])
        return translations


class Translator(BaseTranslator):
    """Translates with our searches (every registered one: greedy, beam, grid beam, sampling,
    a caller's own) on a model of ours.

    Args:
        model: any :class:`~seq2seq.models.interfaces.DecodingModel` (a
            :class:`~seq2seq.models.seq2seq.Seq2Seq`, an exported
            :class:`~seq2seq.inference.onnx_model.OnnxModel`, an
            :class:`~seq2seq.inference.ensemble.Ensemble` of them), already on ``device``.
        precision: ``fp32``, ``bf16``/``fp16`` (the search under autocast: about 2x faster on
            GPUs and on CPUs with bf16 matrix instructions, far slower on CPUs without them: a
            warning says so), or ``auto`` (bf16 where the model decodes in it and the device
            runs it faster, :func:`seq2seq.device.decide_precision`: on a CPU a cached
            measurement; ``self.precision`` is the one chosen).
        quantize: ``int8`` only for a model exported with ``quantize=int8``.
        shortlist: search each batch over the target pieces its
            :class:`~seq2seq.inference.shortlist.Shortlist` keeps (None: the whole vocabulary).

    Raises:
        ValueError: one line naming the setting the model cannot decode with (a
            :class:`~seq2seq.inference.shortlist.ShortlistError` for a shortlist built for
            other vocabularies).
    """

    def __init__(
        self,
        model,
        tokenizers,
        *,
        device: str | torch.device,
        max_tokens: int = 4000,
        max_source_length: int = 250,
        precision: str = "fp32",
        quantize: str = "none",
        shortlist: Shortlist | None = None,
    ) -> None:
        super().__init__(tokenizers, max_tokens=max_tokens, max_source_length=max_source_length)
        self.device = select_device(device)
        self.quantize = check_quantize_mode(quantize)
        if model.cpu_only:
            require_cpu(self.device)
        if precision == "auto" and model.precisions == ("fp32",):
            precision = "fp32"
        if precision in PRECISIONS and precision not in model.precisions:
            # An exported graph runs in the types it was exported with.
            raise ValueError(
                f"this model decodes in {', '.join(model.precisions)} (an exported one in fp32, "
                f"or int8 when exported so), not precision={precision}: give precision=fp32"
            )
        check_int8_decoding(self.quantize, model.quantize, what="model")
        self.quantize = model.quantize  # what runs, as reports read it, whatever was asked
        workload = None
        if precision == "auto":  # timed on the model's own greedy search, in eval mode
            workload = decoding_workload(
                model, source_vocab_size=tokenizers.src.vocab_size, device=self.device)
        with eval_mode(model):
            self.precision = choose_precision(precision, self.device, log=logger,  # ValueError
                                              workload=workload)
        self.autocast_dtype = AUTOCAST_DTYPES[self.precision]
        self.parameter_count = model.parameter_count
        self.model = model
        if shortlist is not None:
            shortlist.check_vocabulary(tokenizers)
        self.shortlist = shortlist

    @contextmanager
    def _decoding(self, options: DecodeOptions) -> Iterator[torch.Generator | None]:
        """The model in eval mode; a seeded sample's generator, seeded anew for the call."""
        generator = (torch.Generator(self.device).manual_seed(options.seed)
                     if options.seeded else None)
        with eval_mode(self.model):
            yield generator

    def _attention_heads(self, src_ids: list[np.ndarray],
                         results: list[list[Hypothesis]]) -> list[Tensor | None]:
        """Each sentence's best hypothesis' (L, H, T + 1, S + 1) attention, from one
        teacher-forced pass (what the search saw: cached = uncached); None where the model has
        no heads to show (:meth:`~seq2seq.models.interfaces.DecodingModel.attention_heads`:
        a Transformer has them, an ensemble or an exported model not) or the source is empty."""
        pairs = [(np.asarray(ids, dtype=np.int64).reshape(-1)[: self.max_source_length],
                  n_best[0]) for ids, n_best in zip(src_ids, results, strict=True)]
        heads: list[Tensor | None] = [None] * len(pairs)
        rows = [row for row, (source, _) in enumerate(pairs) if source.size > 0]
        if not rows:
            return heads
        batch = collate([(pairs[row][0], np.asarray(pairs[row][1].tokens, dtype=np.int64))
                         for row in rows])  # src ends in EOS, tgt_in starts with BOS
        with eval_mode(self.model), torch.no_grad(), autocast(self.device.type,
                                                              self.autocast_dtype):
            weights = self.model.attention_heads(batch.src.to(self.device), batch.src_lengths,
                                                 batch.tgt_in.to(self.device))
        if weights is None:
            return heads
        weights = weights.float().cpu()  # (N, L, H, T, S)
        for i, row in enumerate(rows):
            steps, positions = len(pairs[row][1].tokens) + 1, int(batch.src_lengths[i])
            heads[row] = weights[i, :, :, :steps, :positions].clone()
        return heads

    def _search(self, sources: list[np.ndarray], options: DecodeOptions,
                generator: torch.Generator | None, *, return_attention: bool,
                prefixes: list[list[int]] | None,
                constraints: list[list[list[int]]] | None) -> list[list[Hypothesis]]:
        src, src_lengths = pad_sources(sources)  # (B, S), (B,) with EOS
        src_tensor = src.to(self.device)  # the encoder moves the lengths to src's device
        settings = {"return_attention": return_attention}
        if self.shortlist is not None:
            # The batch's shortlist, plus every piece a prefix or constraint needs.
            needed = [t for p in prefixes or [] for t in p]
            needed += [t for phrases in constraints or [] for p in phrases for t in p]
            ids = self.shortlist.for_sources(sources)
            ids = torch.unique(torch.cat([ids, torch.tensor(needed, dtype=torch.long)]))
            ids = ids.to(self.device)  # (K,) target ids, ascending
            settings["output_ids"] = ids  # the search runs over their positions
            position = {int(t): i for i, t in enumerate(ids.tolist())}
            prefixes = prefixes and [[position[t] for t in p] for p in prefixes]
            constraints = constraints and [[[position[t] for t in p] for p in phrases]
                                           for phrases in constraints]
        if prefixes is not None:
            settings["prefixes"] = pad_prefixes(prefixes, self.device)
        with autocast(self.device.type, self.autocast_dtype):
            return options.search_method.run(
                self.model, src_tensor, src_lengths, options, generator=generator,
                constraints=constraints, **settings)

