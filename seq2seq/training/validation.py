"""Validation during training: loss and perplexity, then BLEU/chrF of greedy translations.

The translations are scored by :func:`seq2seq.inference.evaluation.evaluate_translations`,
the function ``evaluate.py`` uses, so the BLEU logged here is the BLEU ``evaluate.py`` prints
for the same model and settings, and what ``sacrebleu REF -i RUN/validation/stepN.hyp`` prints.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from seq2seq.data.batching import TokenBucketSampler, collate
from seq2seq.device import AUTOCAST_DTYPES
from seq2seq.inference.decode_options import DecodeOptions
from seq2seq.inference.evaluation import evaluate_translations
from seq2seq.inference.translator import Translator, eval_mode
from seq2seq.precision import autocast
from seq2seq.training.loss import SequenceLoss
from seq2seq.training.settings import ValidationSettings

log = logging.getLogger(__name__)


class Validator:
    """Validates a model on one validation set and reports the results.

    ``data`` is the encoded validation split (for the loss), ``sources`` / ``references`` its
    raw lines (for BLEU); ``precision`` (``fp32``, ``bf16`` or ``fp16``) is autocast's, as in
    training; ``output_dir`` gets the ``stepNNNNNNN.hyp`` files (None: not written, e.g. on
    rank > 0); ``writer`` is TensorBoard's, or None.
    """

    def __init__(
        self,
        *,
        data,
        sources: Sequence[str],
        references: Sequence[str],
        tokenizers,
        settings: ValidationSettings,
        precision: str,
        output_dir: Path | None,
        writer=None,
    ) -> None:
        count = len(data)
        if settings.max_sentences:
            count = min(count, settings.max_sentences)
        if len(sources) < count or len(references) < count:
            raise ValueError(f"the validation set has {len(data)} encoded pairs but "
                             f"{len(sources)} sources and {len(references)} references")
        self.data = data
        self.count = count
        self.sources = list(sources[:count])
        self.references = list(references[:count])
        self.tokenizers = tokenizers
        self.settings = settings
        self.precision = precision
        self.output_dir = output_dir
        self.writer = writer
        self.signature_reported = False

    @torch.inference_mode()
    def loss(self, model, device: torch.device) -> float:
        """Mean per-token negative log-likelihood of the validation targets."""
        sampler = TokenBucketSampler(
            src_lengths=self.data.src_lengths[: self.count],
            tgt_lengths=self.data.tgt_lengths[: self.count],
            max_tokens=self.settings.max_tokens,
            shuffle=False,
        )
        objective = SequenceLoss(model)
        loss_sum = torch.zeros((), device=device)
        tokens = 0
        for indices in sampler:
            batch = collate([self.data[i] for i in indices], indices).to(device)
            with autocast(device.type, AUTOCAST_DTYPES[self.precision]):
                _, nll = objective(batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out)
            loss_sum += nll
            tokens += batch.num_tgt_tokens
        return loss_sum.item() / max(tokens, 1)

    def translator(self, model, device: torch.device) -> Translator:
        return Translator(model, self.tokenizers, device=device,
                          max_tokens=self.settings.max_tokens, precision=self.precision)

    @property
    def options(self) -> DecodeOptions:
        """Validation decodes greedily, under the configured output length limit."""
        return DecodeOptions(beam_size=1, max_len_a=self.settings.max_len_a,
                             max_len_b=self.settings.max_len_b)

    def __call__(self, model, *, device: torch.device, step: int, epoch: int,
                 minutes: float | None = None) -> dict:
        """Validate ``model`` (its train/eval mode is restored after); report; return scores.

        ``minutes``: the minutes trained so far, for the log line (the val curve against time).
        """
        with eval_mode(model):
            hyp_path = self.output_dir / f"step{step:07d}.hyp" if self.output_dir else None
            scores, hypotheses, translator = self.evaluate(model, device, hyp_path)
            self._report(scores, hypotheses, hyp_path, translator, step, epoch, minutes)
        return scores

    def evaluate(self, model, device: torch.device, hyp_path: Path | None = None):
        """Score ``model`` (in eval mode) without reporting: the validation of a model that is
        not the one being trained, e.g. the average of the last checkpoints. Returns
        ``(scores, hypotheses, translator)``: loss, ppl, BLEU, chrF (and their signatures) and
        seconds; the detokenized translations, also written to ``hyp_path`` if given.
        """
        started = time.perf_counter()
        loss = self.loss(model, device)
        translator = self.translator(model, device)
        # No bar of its own: the training bar (or trainer.progress_bar=false) speaks for it.
        evaluation = evaluate_translations(translator, self.sources, self.references,
                                           self.options, hypotheses_path=hyp_path,
                                           progress=False)
        scores = dict(evaluation.scores, loss=loss, ppl=math.exp(min(loss, 100)),
                      seconds=time.perf_counter() - started)
        return scores, evaluation.hypotheses, translator

    def _report(self, scores, hypotheses, hyp_path, translator, step: int, epoch: int,
                minutes: float | None = None) -> None:
        first_report = not self.signature_reported
        if first_report:  # once per process, so also once after a resume
            log.info("sacreBLEU signature: %s | chrF: %s",
                     scores["bleu_signature"], scores["chrf_signature"])
            self.signature_reported = True
        log.info(
            "validation step %d epoch %d: loss %.3f ppl %.2f BLEU %.2f chrF %.2f (%d sentences, "
            "%.1fs%s) -> %s",
            step, epoch, scores["loss"], scores["ppl"], scores["bleu"], scores["chrf"],
            len(hypotheses), scores["seconds"],
            "" if minutes is None else f", after {minutes:.2f} min of training", hyp_path,
        )
        writer = self.writer
        if writer is None:
            return
        for name in ("loss", "ppl", "bleu", "chrf"):
            writer.add_scalar(f"valid/{name}", scores[name], step)
        if first_report:
            writer.add_text("valid/bleu_signature", scores["bleu_signature"], step)
        examples = [
            f"**source** {s}  \n**reference** {r}  \n**hypothesis** {h}"
            for s, r, h in list(zip(self.sources, self.references, hypotheses, strict=True))[
                : self.settings.num_examples]
        ]
        if examples:
            writer.add_text("valid/examples", "\n\n---\n\n".join(examples), step)
        index = self.settings.attention_plot_index
        if 0 <= index < len(self.sources):
            try:
                self._plot_attention(translator, self.sources[index], step)
            except Exception as error:  # a plot must never stop training
                log.warning("could not draw the attention heatmap: %s", error)
        writer.flush()

    def _plot_attention(self, translator: Translator, source: str, step: int) -> None:
        from seq2seq.inference.attention_plot import plot_attention

        best = translator.translate([source], self.options, return_attention=True)[0][0]
        if best.attention is None:
            return
        source_pieces = best.source_pieces + ["</s>"]
        target_pieces = best.target_pieces + ["</s>"]
        weights = best.attention.float().cpu().numpy()[: len(target_pieces), : len(source_pieces)]
        figure = plot_attention(weights, source_pieces, target_pieces, title=f"step {step}")
        self.writer.add_figure("valid/attention", figure, step, close=True)
