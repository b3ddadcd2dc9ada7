"""What every export format shares once torch is loaded: the checks of the model, the folder
written beside its destination and renamed into place (whole or absent), and the random pairs an
exported model is checked on against ours. The one-line error and the checks of the options are
:mod:`seq2seq.export`'s (torch-free), the manifest's common entries
:mod:`seq2seq.export.manifest`'s."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch import nn

from seq2seq.atomic import default_permissions, fsync_directory
from seq2seq.data.vocab import BOS_ID, EOS_ID
from seq2seq.export import ExportError, check_export_options
from seq2seq.models.transformer import TransformerDecoder, TransformerEncoder

# The random pairs an export is checked on: how many, and the longest source and target.
CHECK_SENTENCES, CHECK_LENGTH = 6, 9


def publish(staging: Path, output: Path, *, overwrite: bool) -> None:
    """Rename ``staging`` to ``output``; an earlier export there is moved aside first and
    removed only once the new one is in place."""
    check_export_options(output, quantize="none", overwrite=overwrite)  # it may have appeared
    old = None
    if output.exists():
        old = staging.with_name(f"{staging.name}.old")
        output.rename(old)
    try:
        staging.rename(output)
    except BaseException:
        if old is not None:
            old.rename(output)
        raise
    fsync_directory(output.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def staged_folder(output: Path, *, overwrite: bool) -> Iterator[Path]:
    """A new folder beside ``output`` to write an export into: renamed to ``output`` when the
    block ends, removed when it raises."""
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent))
    try:
        yield staging
        default_permissions(staging, directory=True)
        publish(staging, output, overwrite=overwrite)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def transformer_parts(model: nn.Module, format_name: str
                      ) -> tuple[TransformerEncoder, TransformerDecoder]:
    """The encoder and decoder of a Transformer with one d_model, for the formats that convert
    the Transformer's own layers (CTranslate2, Hugging Face).

    Raises:
        ExportError: naming the format and the one every model exports to (onnx).
    """
    encoder, decoder = model.encoder, model.decoder
    if not (isinstance(encoder, TransformerEncoder) and isinstance(decoder, TransformerDecoder)):
        raise ExportError(
            f"format={format_name} converts a Transformer (model/encoder=transformer "
            f"model/decoder=transformer), not a {type(encoder).__name__} with a "
            f"{type(decoder).__name__}: export it with format=onnx (ONNX Runtime), which "
            "takes every model")
    if encoder.output_size != decoder.output_dim:
        raise ExportError(f"format={format_name} needs one d_model for the encoder "
                          f"({encoder.output_size}) and the decoder ({decoder.output_dim})")
    return encoder, decoder


def random_pairs(tokenizers) -> tuple[list[list[int]], list[list[int]]]:
    """Random source and target ids (no special pieces), of several lengths: what an exported
    model is checked on against ours."""
    generator = torch.Generator().manual_seed(4)
    sources, targets = [], []
    for row in range(CHECK_SENTENCES):
        for ids, size in ((sources, tokenizers.src.vocab_size),
                          (targets, tokenizers.tgt.vocab_size)):
            length = CHECK_LENGTH - row % 4
            ids.append(torch.randint(4, max(size, 5), (length,), generator=generator).tolist())
    return sources, targets


def model_log_probs(model: nn.Module, sources: list[list[int]], targets: list[list[int]]
                    ) -> list[np.ndarray]:
    """The model's log-probability of each target piece and of the final </s> (teacher
    forcing, one pair at a time)."""
    log_probs = []
    with torch.no_grad():
        for source, target in zip(sources, targets, strict=True):
            src = torch.tensor([[*source, EOS_ID]])
            tgt_in = torch.tensor([[BOS_ID, *target]])
            features, _ = model(src, torch.tensor([src.size(1)]), tgt_in, need_weights=False)
            logits = model.project(features)[0].float().log_softmax(dim=-1)  # (T, V)
            gold = torch.tensor([*target, EOS_ID])
            log_probs.append(logits.gather(1, gold.unsqueeze(1)).squeeze(1).numpy())
    return log_probs


def largest_log_prob_difference(model: nn.Module, tokenizers, score, *, whose: str,
                                tolerance: float | None) -> float:
    """The largest difference between the model's log-probability of a target piece (or of
    </s>) and ``score(sources, targets)``'s, the exported model's per pair, on
    :func:`random_pairs`.

    Raises:
        ExportError: where the difference is over ``tolerance`` (None: no limit, for a
            quantized folder), naming ``whose`` ("CTranslate2's").
    """
    sources, targets = random_pairs(tokenizers)
    got = score(sources, targets)
    worst = float(np.max([np.abs(np.asarray(theirs) - ours).max()  # a NaN wins, as it must
                          for theirs, ours in zip(got, model_log_probs(model, sources, targets),
                                                  strict=True)]))
    if tolerance is not None and not worst <= tolerance:
        raise ExportError(f"{whose} log-probabilities differ from the model's by "
                          f"{worst:.2g}: the folder is not the model")
    return worst
