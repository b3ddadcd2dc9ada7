"""A CTranslate2 folder (``seq2seq-export ... format=ctranslate2``) behind the translators' interface.

:class:`CTranslate2Translator` is a :class:`~seq2seq.inference.translator.BaseTranslator`: the
tokenization, batching, empty sentences, checks of the request and the conversion to
``Translation`` s are the shared part's; CTranslate2 runs the search, on its own terms, with
one ``translate_batch`` call per batch (two for a beam search with attention below
CTranslate2 4.9, whose first attention row is another sentence's: a greedy first step gives
the right one). The one adaptation: its n-best list is re-scored and re-ranked under our (GNMT)
length penalty, so that a score means what a checkpoint's means. What each option becomes, and
where CTranslate2 decodes otherwise (output length limits, forced prefixes, seeds, attention),
is the table in docs/export.md ("In translate.py, evaluate.py and serve.py").

Refused in one line, each naming the option: what :attr:`CTranslate2Translator.cannot` lists,
``quantize=int8`` for a float folder, and lengths past the folder's position table.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seq2seq.checkpoint import CheckpointError
from seq2seq.config_types import error_reason
from seq2seq.data.text_files import DataError
from seq2seq.data.vocab import BOS_PIECE, EOS_PIECE, PAD_PIECE, UNK_ID
from seq2seq.inference.decode_options import DecodeOptions
from seq2seq.inference.export_format import check_int8_decoding, check_quantize_mode
from seq2seq.inference.search_loop import Hypothesis, length_penalty_factor, max_output_lengths
from seq2seq.inference.translator import BaseTranslator

logger = logging.getLogger(__name__)

# Our searches never generate these; CTranslate2 is told the same.
NEVER_GENERATED = [[PAD_PIECE], [BOS_PIECE]]
PHRASE_REFUSAL = ("a CTranslate2 folder cannot force phrases: use the checkpoint or an ONNX "
                  "export")
ATTENTION_SOURCE = ("CTranslate2's alignment head: the last decoder layer's first head (a "
                    "CTranslate2 folder gives no other layer or head)")
# ctranslate2.set_random_seed takes a 32-bit seed.
SEED_RANGE = 2**32 - 1
# CTranslate2 up to 4.8 (4.8.5 tested), on the CPU: a beam search over several sentences gives
# sentence i the first attention row of sentence i // beam_size (it gathers that step's rows
# as if it had expanded the beams). Newer versions are taken to be right until a test says not.
FIRST_ROW_FIXED_IN = (4, 9)


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


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())


class CTranslate2Translator(BaseTranslator):
    """Translates with a CTranslate2 folder (see the module docstring for what maps and what is
    refused).

    Args:
        manifest: the folder's (:func:`~seq2seq.inference.model_files.read_manifest`).
        num_threads: CTranslate2's threads (``intra_threads``); None: ``torch.get_num_threads()``,
            which the ``num_threads`` option of the command-line tools sets.
        others: as for :class:`~seq2seq.inference.translator.Translator` (``device``: the CPU).

    Raises:
        ValueError: naming the option, for one out of range or one CTranslate2 cannot honour.
        CheckpointError: when CTranslate2 is not installed or cannot load the folder.
    """

    searches = ("beam", "sample")  # CTranslate2's own searches, not our loop
    cannot = {
        "search": "a CTranslate2 folder runs its own beam and sample searches only: use the "
                  "checkpoint or an ONNX export for others",
        "phrases": PHRASE_REFUSAL,
        "epsilon": "a CTranslate2 folder samples with temperature, top_k and top_p only: give "
                   "epsilon=0",
        "shortlist": "a CTranslate2 folder scores its whole target vocabulary (a shortlist "
                     "restricts our searches' output layer): leave shortlist out",
        "precision": "a CTranslate2 folder decodes in the types it was exported with (float32, "
                     "or int8 weights with quantize=int8): give precision=fp32",
        "device": "a CTranslate2 folder decodes on the CPU here: give device=cpu",
    }
    # docs/export.md#in-translatepy-evaluatepy-and-servepy gives each in full.
    differs = (
        "beam search with its own length penalty (length ** alpha) and end rules, its n-best "
        "list then scored and ranked under GNMT's",
        "one output length limit a batch (its longest sentence's), each hypothesis then cut "
        "to its own sentence's",
        "forced prefix pieces scored 0: a score counts the pieces after the prefix",
        "a seeded sample repeats only in a process's first sampling call",
        "attention: its alignment head, the last decoder layer's first head",
    )
    attention_source = ATTENTION_SOURCE

    def __init__(
        self,
        folder: str | os.PathLike,
        manifest: dict[str, Any],
        tokenizers,
        *,
        device: str | torch.device = "cpu",
        max_tokens: int = 4000,
        max_source_length: int = 250,
        precision: str = "fp32",
        quantize: str = "none",
        shortlist=None,
        num_threads: int | None = None,
    ) -> None:
        super().__init__(tokenizers, max_tokens=max_tokens, max_source_length=max_source_length)
        self.device = self._cpu(device)
        if precision not in ("fp32", "auto"):
            raise ValueError(f"precision={precision}: {self.cannot['precision']}")
        if shortlist is not None:
            raise ValueError(f"shortlist: {self.cannot['shortlist']}")
        exported = manifest["export"]["quantize"]
        check_int8_decoding(check_quantize_mode(quantize), exported, what="folder",
                            options="format=ctranslate2 ")
        self.max_positions = int(manifest["export"]["max_positions"])
        if max_source_length + 1 > self.max_positions:
            raise ValueError(
                f"max_source_length={max_source_length}: the CTranslate2 folder's position "
                f"table holds {self.max_positions} source positions, its EOS included: give "
                f"max_source_length={self.max_positions - 1} or less")
        self.folder = Path(folder)
        self.manifest = manifest
        self.precision = "fp32"  # the folder's types, int8 weights included (see quantize)
        self.autocast_dtype = None
        self.quantize = exported  # what runs, as reports read it, whatever was asked
        self.parameter_count = int(manifest["parameters"])
        self._ctranslate2 = _ctranslate2()
        self._first_row_wrong = _version(self._ctranslate2.__version__) < FIRST_ROW_FIXED_IN
        try:
            # One worker thread (ours call it one batch at a time), num_threads for its products.
            self.engine = self._ctranslate2.Translator(
                str(self.folder), device="cpu", inter_threads=1,
                intra_threads=num_threads or torch.get_num_threads())
        except Exception as error:  # ctranslate2's own error types
            raise CheckpointError(f"CTranslate2 cannot load {self.folder}: "
                                  f"{error_reason(error)}") from None
        tgt = tokenizers.tgt
        # CTranslate2's target vocabulary is our target pieces in id order.
        self._target_id = {tgt.id_to_piece(i): i for i in range(tgt.vocab_size)}

    @staticmethod
    def _cpu(device: str | torch.device) -> torch.device:
        try:
            chosen = torch.device("cpu" if str(device) == "auto" else device)
        except RuntimeError:
            raise ValueError(f"unknown device {device!r}: use auto or cpu") from None
        if chosen.type != "cpu":
            raise ValueError(f"device={device}: {CTranslate2Translator.cannot['device']}")
        return chosen

    def check(self, options: DecodeOptions, *, phrases: bool = False) -> None:
        """As :meth:`BaseTranslator.check`, and the output length limit within the folder's
        position table."""
        super().check(options, phrases=phrases)
        longest = int(self._limits([self.max_source_length], options)[0])
        if longest + 1 > self.max_positions:
            raise ValueError(
                f"max_len_a={options.max_len_a}, max_len_b={options.max_len_b}: a source of "
                f"max_source_length={self.max_source_length} pieces may get {longest} output "
                f"pieces, past the {self.max_positions - 1} the CTranslate2 folder's position "
                "table allows")

    @staticmethod
    def _limits(source_sizes: list[int], options: DecodeOptions) -> list[int]:
        """Each source's output limit, as our searches compute it (EOS not counted)."""
        lengths = torch.tensor(source_sizes, dtype=torch.long) + 1  # the source's EOS counts
        return max_output_lengths(lengths, max_len_a=options.max_len_a,
                                  max_len_b=options.max_len_b).tolist()

    @contextmanager
    def _decoding(self, options: DecodeOptions) -> Iterator[Any]:
        # CTranslate2 seeds a worker thread's generator once, when it first samples: a seeded
        # first call repeats, later ones go on drawing (docs/export.md).
        if options.seeded:
            self._ctranslate2.set_random_seed(options.seed % SEED_RANGE)
        yield self.engine

    def _search(self, sources: list[np.ndarray], options: DecodeOptions, engine, *,
                return_attention: bool, prefixes: list[list[int]] | None,
                constraints: list[list[list[int]]] | None) -> list[list[Hypothesis]]:
        """One ``translate_batch`` call over a batch of non-empty sources (and a one-step one
        for the first attention rows, below CTranslate2 4.9); each hypothesis cut to its
        sentence's limit, scored under our length penalty, the n-best re-ranked."""
        forced = prefixes or [[] for _ in sources]
        for prefix in forced:
            if len(prefix) + 1 > self.max_positions:
                raise ValueError(f"a prefix of {len(prefix)} pieces, past the "
                                 f"{self.max_positions - 1} the CTranslate2 folder's position "
                                 "table allows")
        limits = [max(limit, len(prefix)) for limit, prefix in
                  zip(self._limits([s.size for s in sources], options), forced, strict=True)]
        sampled = options.search == "sample"
        copies = options.nbest if sampled else 1  # each sample its own row
        rows = [row for row in range(len(sources)) for _ in range(copies)]
        settings: dict[str, Any] = {
            "beam_size": 1 if sampled else options.beam_size,
            "num_hypotheses": 1 if sampled else options.nbest,
            "length_penalty": options.length_penalty,
            # One step past the longest limit: the step where a cut hypothesis' EOS would be.
            "max_decoding_length": max(limits) + 1, "min_decoding_length": 0,
            "max_input_length": 0, "suppress_sequences": NEVER_GENERATED,
            "return_scores": True, "return_end_token": True,
            "return_attention": return_attention,
        }
        if sampled:
            settings.update(  # CTranslate2's top-k of 0 is the whole vocabulary, as ours
                sampling_topk=options.top_k if options.top_k < len(self._target_id) else 0,
                sampling_topp=options.top_p, sampling_temperature=options.temperature)
        source_pieces = [self.tokenizers.src.pieces(sources[row].tolist()) for row in rows]
        target_prefix = ([self.tokenizers.tgt.pieces(forced[row]) for row in rows]
                         if any(forced) else None)
        results = self._run(engine, source_pieces, target_prefix, **settings)
        first_rows = None
        if return_attention and not sampled and options.beam_size > 1 and len(rows) > 1 \
                and self._first_row_wrong:
            first_rows = self._run(engine, source_pieces, beam_size=1, max_decoding_length=1,
                                   min_decoding_length=0, max_input_length=0,
                                   return_end_token=True, return_attention=True)
        per_sentence: list[list[Hypothesis]] = [[] for _ in sources]
        for index, (row, result) in enumerate(zip(rows, results, strict=True)):
            attentions = result.attention or [None] * len(result.hypotheses)
            for pieces, score, attention in zip(result.hypotheses, result.scores, attentions,
                                                strict=True):
                if first_rows is not None:
                    attention = [first_rows[index].attention[0][0], *attention[1:]]
                per_sentence[row].append(
                    self._hypothesis(pieces, score, attention, limits[row], options))
        # Best first by our score (stable: CTranslate2's order among equals).
        return [sorted(hypotheses, key=lambda h: -h.score)[: options.nbest]
                for hypotheses in per_sentence]

    def _hypothesis(self, pieces: list[str], score: float, attention, limit: int,
                    options: DecodeOptions) -> Hypothesis:
        """One of CTranslate2's hypotheses in our ids, cut to ``limit`` pieces, scored as ours:
        its summed log-probability (CTranslate2's score times ``len(pieces) ** alpha``, EOS
        counted) over the GNMT penalty of its length, EOS counted."""
        log_prob = score * len(pieces) ** options.length_penalty
        ended = bool(pieces) and pieces[-1] == EOS_PIECE
        tokens = [self._target_id.get(piece, UNK_ID) for piece in
                  (pieces[:-1] if ended else pieces)][:limit]
        rows = None if attention is None else _with_eos_column(
            [list(step) for step in attention[: len(tokens) + 1]])
        return Hypothesis(tokens, float(log_prob / length_penalty_factor(
            len(tokens) + 1.0, options.length_penalty)), rows)

    def _run(self, engine, *args, **settings):
        """``engine.translate_batch(...)``, its errors in one line."""
        try:
            return engine.translate_batch(*args, **settings)
        except Exception as error:  # ctranslate2's own error types
            raise DataError(f"the CTranslate2 folder {self.folder} could not decode a batch: "
                            f"{error_reason(error)}") from None
