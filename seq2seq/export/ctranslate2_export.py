"""Convert a Transformer to a CTranslate2 model folder (``seq2seq-export format=ctranslate2``).

Our Transformer (:mod:`seq2seq.models.transformer`) is CTranslate2's ``TransformerSpec`` as it
stands, positions given as a table in our interleaved layout and the query, key and value
projections joined into the fused matrices the engine reads. Before the folder is published,
CTranslate2 scores random translations and its log-probabilities must be the model's (within
:data:`LOG_PROB_TOLERANCE` in float32). docs/export.md ("CTranslate2, for a Transformer") gives
the mapping, the folder's files and ``quantize=int8``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from seq2seq.config_types import error_reason
from seq2seq.data.vocab import BOS_PIECE, EOS_PIECE, UNK_PIECE
from seq2seq.export import ExportError, check_export_options
from seq2seq.export.folder import largest_log_prob_difference, staged_folder, transformer_parts
from seq2seq.export.manifest import build_manifest, write_manifest
from seq2seq.inference.export_format import CTRANSLATE2_FORMAT_NAME
from seq2seq.models.transformer import MultiHeadAttention, sinusoidal_positions

# Rows of the position tables: the longest source (EOS included), and the longest output, the
# engine decodes; our tools' defaults stop at 251 and 386.
MAX_POSITIONS = 1024
# Largest difference of a token's log-probability, CTranslate2 against the model (float32).
LOG_PROB_TOLERANCE = 1e-3


def _array(tensor: Tensor) -> np.ndarray:
    """A float32 copy: CTranslate2's quantization works on the arrays in place, and a view would
    quantize the model's own weights."""
    return tensor.detach().to(torch.float32).cpu().numpy().copy()


def _set_linear(spec, *layers: nn.Linear) -> None:
    """One linear layer of the spec from ours; several are stacked into one fused matrix."""
    spec.weight = _array(torch.cat([layer.weight for layer in layers]))
    if layers[0].bias is not None:
        spec.bias = _array(torch.cat([layer.bias for layer in layers]))


def _set_layer_norm(spec, norm: nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def _set_self_attention(spec, norm: nn.LayerNorm, attention: MultiHeadAttention) -> None:
    _set_layer_norm(spec.layer_norm, norm)
    _set_linear(spec.linear[0], attention.query_proj, attention.key_proj, attention.value_proj)
    _set_linear(spec.linear[1], attention.out_proj)


def _set_feed_forward(spec, norm: nn.LayerNorm, feed_forward: nn.Sequential) -> None:
    _set_layer_norm(spec.layer_norm, norm)
    _set_linear(spec.linear_0, feed_forward[0])
    _set_linear(spec.linear_1, feed_forward[-1])


def _vocabulary(tokenizer) -> list[str]:
    return [tokenizer.id_to_piece(token_id) for token_id in range(tokenizer.vocab_size)]


def transformer_spec(model: nn.Module, tokenizers):
    """The ``ctranslate2.specs.TransformerSpec`` of ``model``, with its vocabularies.

    Raises:
        ExportError: when the model is not a Transformer encoder and decoder.
    """
    from ctranslate2.specs import common_spec, transformer_spec

    encoder, decoder = transformer_parts(model, "ctranslate2")
    num_heads = decoder.num_heads
    if encoder.layers[0].self_attention.num_heads != num_heads:
        raise ExportError("format=ctranslate2 needs as many heads in the encoder as in the "
                          "decoder (CTranslate2 takes one number)")
    spec = transformer_spec.TransformerSpec.from_config(
        (len(encoder.layers), len(decoder.layers)), num_heads, pre_norm=True,
        activation=common_spec.Activation.RELU)
    spec.config.layer_norm_epsilon = encoder.final_norm.eps
    spec.config.add_source_eos = True  # our sources end with </s>, as in training
    spec.config.unk_token, spec.config.bos_token = UNK_PIECE, BOS_PIECE
    spec.config.eos_token, spec.config.decoder_start_token = EOS_PIECE, BOS_PIECE
    positions = _array(sinusoidal_positions(torch.arange(MAX_POSITIONS), encoder.output_size))

    spec.encoder.embeddings[0].weight = _array(encoder.embedding.weight)
    spec.encoder.position_encodings.encodings = positions
    for layer_spec, layer in zip(spec.encoder.layer, encoder.layers, strict=True):
        _set_self_attention(layer_spec.self_attention, layer.self_attention_norm,
                            layer.self_attention)
        _set_feed_forward(layer_spec.ffn, layer.feed_forward_norm, layer.feed_forward)
    _set_layer_norm(spec.encoder.layer_norm, encoder.final_norm)

    spec.decoder.embeddings.weight = _array(decoder.embedding.weight)
    spec.decoder.position_encodings.encodings = positions
    for layer_spec, layer in zip(spec.decoder.layer, decoder.layers, strict=True):
        _set_self_attention(layer_spec.self_attention, layer.self_attention_norm,
                            layer.self_attention)
        cross = layer.cross_attention
        _set_layer_norm(layer_spec.attention.layer_norm, layer.cross_attention_norm)
        _set_linear(layer_spec.attention.linear[0], cross.query_proj)
        _set_linear(layer_spec.attention.linear[1], cross.key_proj, cross.value_proj)
        _set_linear(layer_spec.attention.linear[2], cross.out_proj)
        _set_feed_forward(layer_spec.ffn, layer.feed_forward_norm, layer.feed_forward)
    _set_layer_norm(spec.decoder.layer_norm, decoder.final_norm)
    _set_linear(spec.decoder.projection, model.generator)

    spec.register_source_vocabulary(_vocabulary(tokenizers.src))
    spec.register_target_vocabulary(_vocabulary(tokenizers.tgt))
    return spec


def check_against_model(model: nn.Module, tokenizers, folder: Path, *, quantize: str) -> float:
    """Score random translations with CTranslate2 and with the model; the largest difference of
    a token's log-probability.

    Raises:
        ExportError: when the folder does not load, or (float32) differs beyond
            :data:`LOG_PROB_TOLERANCE`.
    """
    import ctranslate2

    def score(sources, targets):
        try:
            translator = ctranslate2.Translator(str(folder), device="cpu", intra_threads=1)
            results = translator.score_batch([tokenizers.src.pieces(ids) for ids in sources],
                                             [tokenizers.tgt.pieces(ids) for ids in targets])
        except Exception as error:  # ctranslate2's own errors
            raise ExportError(f"CTranslate2 cannot load or run the converted model: "
                              f"{error_reason(error)}") from None
        return [result.log_probs for result in results]

    return largest_log_prob_difference(
        model, tokenizers, score, whose="CTranslate2's",
        tolerance=LOG_PROB_TOLERANCE if quantize == "none" else None)


def write_model_folder(model: nn.Module, tokenizers, config: dict[str, Any], folder: Path, *,
                       quantize: str, trainer_state: dict[str, Any] | None,
                       source: str | None) -> dict[str, Any]:
    """Convert ``model`` (a Transformer in eval mode, on the CPU) into the empty ``folder`` and
    check it against the model; returns its manifest, for the caller to complete and write
    (:func:`convert_model` as it is, the Argos package with its own entry).

    Raises:
        ExportError: when the model is not a Transformer or the conversion does not reproduce
            it.
    """
    import ctranslate2
    from ctranslate2.converters.converter import Converter

    spec = transformer_spec(model, tokenizers)

    class SpecConverter(Converter):  # the library's conversion steps, from a ready spec
        def _load(self):
            return spec

    quantization = "int8" if quantize == "int8" else "float32"
    SpecConverter().convert(str(folder), quantization=quantization, force=True)
    difference = check_against_model(model, tokenizers, folder, quantize=quantize)
    # After the conversion, which empties the folder it writes into.
    manifest = build_manifest(folder, model, tokenizers, config,
                              format_name=CTRANSLATE2_FORMAT_NAME, quantize=quantize,
                              trainer_state=trainer_state, source=source)
    manifest["export"].update(max_positions=MAX_POSITIONS,
                              largest_log_prob_difference=difference,
                              ctranslate2_version=ctranslate2.__version__)
    return manifest


def convert_model(model: nn.Module, tokenizers, config: dict[str, Any], output: str | Path, *,
                  quantize: str = "none", overwrite: bool = False,
                  trainer_state: dict[str, Any] | None = None,
                  source: str | None = None) -> dict[str, Any]:
    """Convert ``model`` (a Transformer, on the CPU) to the CTranslate2 folder ``output``;
    returns the manifest written. Arguments as for
    :func:`seq2seq.export.onnx_export.export_model`.

    Raises:
        ExportError: when the model is not a Transformer, the conversion does not reproduce
            it, or an option is invalid.
        OSError: when the folder cannot be written.
    """
    check_export_options(output, quantize=quantize, overwrite=overwrite)
    started = time.perf_counter()
    with staged_folder(Path(output), overwrite=overwrite) as staging:
        manifest = write_model_folder(model.eval(), tokenizers, config, staging,
                                      quantize=quantize, trainer_state=trainer_state,
                                      source=source)
        write_manifest(staging, manifest, started=started)
    return manifest
