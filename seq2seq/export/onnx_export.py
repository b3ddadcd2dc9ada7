"""Export a trained model to a folder that ONNX Runtime decodes: two graphs and a manifest.

The encoder graph is ``encode`` followed by ``init_state``, the decoder-step graph one
``decode_step`` (:class:`EncoderGraph`, :class:`StepGraph`), both traced with
``torch.onnx.export`` and every size a batch changes declared open by name (:data:`SENTENCES`,
:data:`ROWS`, :data:`SOURCE_LENGTH`, :data:`DECODED_POSITIONS`). The fp32 graphs must match
the PyTorch model at other sizes than the traced ones before ``quantize=int8`` quantizes them;
the folder appears whole or not at all. docs/export.md ("What the export does", "The folder")
gives each step and the folder's layout; :mod:`seq2seq.inference.onnx_model` decodes it.
"""

from __future__ import annotations

import logging
import re
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from seq2seq.data.vocab import BOS_ID, EOS_ID, PAD_ID
from seq2seq.export.folder import ExportError, check_export_options, staged_folder
from seq2seq.export.gru_products import gru_steps_as_products
from seq2seq.export.manifest import build_manifest, write_manifest
from seq2seq.inference.export_format import (
    ENCODED_NAMES,
    ENCODER_FILE,
    FORMAT_NAME,
    STEP_FILE,
)
from seq2seq.inference.onnx_model import OnnxModel
from seq2seq.models.interfaces import EncodedSource

DEFAULT_OPSET = 20
# Sizes of the example batch the graphs are traced with, and of the batch they are checked
# with: different from each other and from any size a model is likely to have, so that no
# open size is mistaken for a fixed one; short, as the exporter unrolls an RNN over it.
TRACE_SENTENCES, TRACE_ROWS, TRACE_LENGTH = 3, 7, 5
CHECK_SENTENCES, CHECK_ROWS, CHECK_LENGTH = 11, 13, 9
CHECK_STEPS = 4
# Steps decoded before the step graph is traced: a cache that grows is traced at this length
# (0 and 1 would be taken as fixed sizes); the check starts from an empty one.
TRACE_STEPS = 3
# fp32 graphs must give the PyTorch model's logits to this tolerance, relative to their size.
RELATIVE_TOLERANCE = 1e-4
# The names of the open axes, in both graphs' declared shapes (docs/export.md lists them).
SENTENCES, ROWS, SOURCE_LENGTH = "sentences", "rows", "source_length"
DECODED_POSITIONS = "decoded_positions"


class _Graph(nn.Module):
    """A part of ``model`` to trace, its state entries as tensors in ``state_names``' order."""

    def __init__(self, model: nn.Module, state_names: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.state_names = state_names


class EncoderGraph(_Graph):
    """``encode`` and ``init_state`` as one graph (the step graph then needs no final state)."""

    def forward(self, src: Tensor, src_lengths: Tensor) -> tuple[Tensor, ...]:
        encoded = self.model.encode(src, src_lengths)
        state = self.model.init_state(encoded)
        return (encoded.memory, encoded.mask, encoded.keys,
                *(state[name] for name in self.state_names))


class StepGraph(_Graph):
    """One ``decode_step`` with the encoded source and the state as explicit tensors."""

    def forward(self, prev_tokens: Tensor, memory: Tensor, mask: Tensor, keys: Tensor,
                *state: Tensor) -> tuple[Tensor, ...]:
        # A step never reads the encoder's final state: init_state is in the encoder graph.
        encoded = EncodedSource(memory=memory, mask=mask, final=None, keys=keys)
        logits, weights, new_state = self.model.decode_step(
            prev_tokens, dict(zip(self.state_names, state, strict=True)), encoded
        )
        return (logits, weights, *(new_state[name] for name in self.state_names))


def example_sources(sentences: int, length: int, vocab_size: int, seed: int) -> tuple[Tensor, Tensor]:
    """Random padded sources ending in EOS, the first one of the full ``length``.

    Shape:
        - output: src (sentences, length), src_lengths (sentences,)
    """
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, length + 1, (sentences,), generator=generator)
    lengths[0] = length
    src = torch.full((sentences, length), PAD_ID, dtype=torch.long)
    for row, size in enumerate(lengths.tolist()):
        src[row, : size - 1] = torch.randint(4, max(vocab_size, 5), (size - 1,), generator=generator)
        src[row, size - 1] = EOS_ID
    return src, lengths


def _step_inputs(model: nn.Module, src: Tensor, lengths: Tensor, rows: int, seed: int,
                 steps: int = 0):
    """The step's inputs for ``rows`` decoder rows over the sentences of ``src`` (as beams),
    after ``steps`` decoding steps (a Transformer's cache then holds that many positions)."""
    with torch.no_grad():
        encoded = model.encode(src, lengths)
        state = model.init_state(encoded)
    beams = torch.arange(rows) % src.size(0)  # (rows,) each row's sentence
    encoded = encoded.index_select(beams)
    state = {name: value.index_select(0, beams) for name, value in state.items()}
    generator = torch.Generator().manual_seed(seed)
    vocab_size = model.generator.out_features
    prev_tokens = torch.randint(4, max(vocab_size, 5), (rows,), generator=generator)
    prev_tokens[0] = BOS_ID
    with torch.no_grad():
        for _ in range(steps):
            logits, _, state = model.decode_step(prev_tokens, state, encoded)
            prev_tokens = logits.argmax(dim=-1)
    return prev_tokens, encoded, state


def growing_axes(model: nn.Module, prev_tokens: Tensor, encoded: EncodedSource,
                 state: dict[str, Tensor]) -> dict[str, list[int]]:
    """For each state entry, the axes that grow by a step (a Transformer's cache: the decoded
    positions); none for an RNN's state, whose size is fixed."""
    with torch.no_grad():
        _, _, after = model.decode_step(prev_tokens, state, encoded)
    return {name: [axis for axis, (a, b) in enumerate(zip(value.shape, after[name].shape,
                                                          strict=True)) if a != b]
            for name, value in state.items()}


def length_axes(model: nn.Module, vocab_size: int) -> list[int]:
    """For memory, mask and keys, the axis that has the source length (the scorer decides the
    keys' layout: (B, S, *) for most, (B, H, S, *) for a multi-head one)."""
    shapes = []
    for length in (TRACE_LENGTH, CHECK_LENGTH):
        src, lengths = example_sources(TRACE_SENTENCES, length, vocab_size, seed=0)
        with torch.no_grad():
            encoded = model.encode(src, lengths)
        shapes.append([t.shape for t in (encoded.memory, encoded.mask, encoded.keys)])
    axes = []
    for name, first, second in zip(ENCODED_NAMES, *shapes, strict=True):
        changed = [axis for axis, (a, b) in enumerate(zip(first, second, strict=True)) if a != b]
        if len(changed) != 1:
            raise ExportError(f"the encoded source's {name} has shape {tuple(first)} for "
                              f"{TRACE_LENGTH} source positions: no single axis follows the "
                              "source length")
        axes.append(changed[0])
    return axes


@contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporter's own notes (its optimizer's INFO lines, its deprecation warnings) are
    about its internals, not the user's model: errors still come through as exceptions."""
    loggers = [logging.getLogger(name) for name in ("onnxscript", "onnx_ir", "torch.onnx")]
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _export(module: nn.Module, args: tuple, path: Path, *, dynamic: tuple,
            input_names: list[str], output_names: list[str], opset: int, what: str) -> None:
    # torch 2.13's exporter swaps the RNN operators' kernels for its own while it traces and
    # back, without clearing their dispatch caches: a later export in the process (after a
    # failed one, or several) would then trace the RNNs for the example's source length.
    for rnn in (torch.ops.aten.gru.input, torch.ops.aten.lstm.input):
        rnn._dispatch_cache.clear()
    try:
        with _quiet_exporter():
            torch.onnx.export(
                module, args, str(path), input_names=input_names, output_names=output_names,
                opset_version=opset, dynamo=True, external_data=False, verbose=False,
                dynamic_shapes=dynamic,
            )
    except Exception as error:  # the exporter raises many types; the reason is in the text
        raise ExportError(f"cannot export the {what}: {_reason(error)}") from None


def _reason(error: BaseException) -> str:
    """The line of an exporter's message that names what failed."""
    text = str(error)
    operation = re.search(r"No ONNX function found for <OpOverload\(op='([^']+)'", text)
    if operation:
        return f"the operation {operation.group(1)} has no ONNX translation"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if "## Exception summary" in lines[:-1]:  # torch.onnx's report: the cause follows
        cause = lines[lines.index("## Exception summary") + 1]
        return re.sub(r"^<class '[^']*'>: ", "", cause)[:300]
    for marker in ("Unsupported", "unsupported", "not supported", "Could not", "Cannot",
                   "cannot", "Failed"):
        for line in lines:
            if marker in line:
                return line[:300]
    return lines[0][:300] if lines else type(error).__name__


def _max_relative_difference(got: np.ndarray, want: Tensor) -> float:
    want_array = want.detach().float().numpy()
    if want_array.size == 0:
        return 0.0
    difference = np.abs(got.astype(np.float64) - want_array.astype(np.float64)).max()
    return float(difference / (1.0 + np.abs(want_array).max()))


def check_against_model(model: nn.Module, folder: Path, manifest: dict[str, Any]) -> float:
    """Decode a batch unlike the traced one with the folder's graphs and with ``model``; the
    largest relative difference of their outputs.

    Raises:
        ExportError: when the graphs do not run on that batch, or differ beyond
            :data:`RELATIVE_TOLERANCE` (they were traced for fixed sizes or other values).
    """
    vocab_size = manifest["vocabulary"]["source_size"]
    src, lengths = example_sources(CHECK_SENTENCES, CHECK_LENGTH, vocab_size, seed=2)
    prev_tokens, encoded, state = _step_inputs(model, src, lengths, CHECK_ROWS, seed=3)
    exported = OnnxModel(folder, manifest, num_threads=1, reuse_sessions=False)
    differences = []  # np.max, not max(): a NaN must win
    try:
        with torch.no_grad():
            got = exported.encode(src, lengths)
            want = model.encode(src, lengths)
            differences += [_max_relative_difference(g.numpy(), w) for g, w in
                            zip((got.memory, got.mask, got.keys),
                                (want.memory, want.mask, want.keys), strict=True)]
            got_encoded = got.index_select(torch.arange(CHECK_ROWS) % CHECK_SENTENCES)
            got_state = exported.init_state(got_encoded)
            for _ in range(CHECK_STEPS):
                logits, weights, state = model.decode_step(prev_tokens, state, encoded)
                got_logits, got_weights, got_state = exported.decode_step(
                    prev_tokens, got_state, got_encoded
                )
                differences += [_max_relative_difference(got_logits.numpy(), logits),
                                _max_relative_difference(got_weights.numpy(), weights)]
                prev_tokens = logits.argmax(dim=-1)
    except Exception as error:  # onnxruntime's own error types
        raise ExportError(
            f"the exported graphs do not run on a batch of other sizes than the traced one "
            f"({_reason(error)}): a part of the model fixes a size while tracing"
        ) from None
    worst = float(np.max(differences))
    if not worst <= RELATIVE_TOLERANCE:
        raise ExportError(
            f"the exported graphs differ from the model by {worst:.2g} (relative) on a batch of "
            "other sizes than the traced one: a part of the model (e.g. Python code that "
            "reads a tensor's size or values) was traced for the example batch only"
        )
    return worst


def declare_open_axes(path: Path, open_axes: dict[str, dict[int, str]],
                      observed: dict[str, list[tuple[int, ...]]] | None = None) -> None:
    """Declare open, by name, the axes ``open_axes`` gives for the graph's inputs and outputs
    (value name -> {axis: name}), and any other output axis that ran at other sizes than the
    graph states (``observed``: output name -> shapes); drop the shapes of intermediate values.

    Some exporter translations (the RNNs') record the traced size of an open axis, on an output
    or on an intermediate value; ONNX Runtime, which infers the intermediate shapes itself when
    it loads a graph, would warn at every run of another size.
    """
    import onnx

    graph_model = onnx.load(str(path))
    graph = graph_model.graph
    del graph.value_info[:]
    for value in (*graph.input, *graph.output):
        dims = value.type.tensor_type.shape.dim
        for axis, name in open_axes.get(value.name, {}).items():
            dims[axis].dim_param = name
        shapes = (observed or {}).get(value.name, [])
        for axis, dim in enumerate(dims):
            if dim.HasField("dim_value") and any(s[axis] != dim.dim_value for s in shapes):
                dim.dim_param = f"{value.name}_{axis}"
    onnx.save(graph_model, str(path))


def graph_open_axes(state_names, source_axes: list[int],
                    growing: dict[str, list[int]]) -> dict[str, dict[str, dict[int, str]]]:
    """Each graph's open axes by value name: the batch (sentences in the encoder, decoder rows
    in the step), the source length of the encoded source and of the weights, and the decoded
    positions of a state that grows a position a step (0 in the encoder's initial state)."""

    def encoded(batch: str) -> dict[str, dict[int, str]]:
        return {name: {0: batch, axis: SOURCE_LENGTH}
                for name, axis in zip(ENCODED_NAMES, source_axes, strict=True)}

    def state(batch: str, positions: str | None, prefix: str = "") -> dict[str, dict[int, str]]:
        return {f"{prefix}{name}": {0: batch, **({axis: positions for axis in growing[name]}
                                                 if positions else {})}
                for name in state_names}

    return {
        ENCODER_FILE: {"src": {0: SENTENCES, 1: SOURCE_LENGTH}, "src_lengths": {0: SENTENCES},
                       **encoded(SENTENCES), **state(SENTENCES, None)},
        STEP_FILE: {"prev_tokens": {0: ROWS}, **encoded(ROWS),
                    **state(ROWS, DECODED_POSITIONS), "logits": {0: ROWS},
                    "weights": {0: ROWS, 1: SOURCE_LENGTH},
                    **state(ROWS, f"{DECODED_POSITIONS} + 1", prefix="new_")},
    }


def encoder_output_names(state_names) -> list[str]:
    return [*ENCODED_NAMES, *state_names]


def step_output_names(state_names) -> list[str]:
    return ["logits", "weights", *(f"new_{name}" for name in state_names)]


def _observed_shapes(folder: Path, manifest: dict[str, Any]):
    """Each graph's output shapes, by output name, at the traced and at the checking sizes."""
    vocab_size = manifest["vocabulary"]["source_size"]
    model = OnnxModel(folder, manifest, num_threads=1, reuse_sessions=False)
    shapes: dict[str, dict[str, list[tuple[int, ...]]]] = {ENCODER_FILE: {}, STEP_FILE: {}}
    for sentences, length, rows in ((TRACE_SENTENCES, TRACE_LENGTH, TRACE_ROWS),
                                    (CHECK_SENTENCES, CHECK_LENGTH, CHECK_ROWS)):
        src, lengths = example_sources(sentences, length, vocab_size, seed=4)
        encoded = model.encode(src, lengths)
        beams = encoded.index_select(torch.arange(rows) % sentences)
        logits, weights, state = model.decode_step(torch.full((rows,), BOS_ID),
                                                   model.init_state(beams), beams)
        outputs = {
            ENCODER_FILE: zip(encoder_output_names(model.state_names),
                              [*encoded[:3], *encoded.initial_state], strict=True),
            STEP_FILE: zip(step_output_names(model.state_names),
                           [logits, weights, *state.values()], strict=True),
        }
        for graph, named in outputs.items():
            for name, tensor in named:
                shapes[graph].setdefault(name, []).append(tuple(tensor.shape))
    return shapes


def quantize_graphs(folder: Path, *, embeddings: bool = False) -> None:
    """Replace both graphs by their int8 versions: weights of matrix products in int8,
    activations quantized on the fly (ONNX Runtime's dynamic quantization); ``embeddings``:
    the embedding tables too (int8 rows dequantized as they are looked up)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    for name in (ENCODER_FILE, STEP_FILE):
        path = folder / name
        quantized = folder / f"{name}.int8"
        # Its one warning advises a shape pre-processing pass, which here gives unfused
        # MatMulInteger nodes in place of DynamicQuantizeMatMul: the pass is left out, and the
        # warning (on the root logger) with it.
        logging.disable(logging.WARNING)
        try:
            quantize_dynamic(str(path), str(quantized), weight_type=QuantType.QInt8,
                             op_types_to_quantize=["MatMul", "Gemm"]
                             + (["Gather"] if embeddings else []))
        finally:
            logging.disable(logging.NOTSET)
        # The quantizer infers the shapes again and may state traced sizes: the fp32 graph's
        # declarations are the ones checked.
        _copy_declared_shapes(path, quantized)
        quantized.replace(path)


def _copy_declared_shapes(source: Path, path: Path) -> None:
    """Give the graph at ``path`` the input and output shapes of the graph at ``source`` (same
    names), and drop the shapes of its intermediate values."""
    import onnx

    graph = onnx.load(str(source)).graph
    declared = {value.name: value.type.tensor_type.shape
                for value in (*graph.input, *graph.output)}
    graph_model = onnx.load(str(path))
    del graph_model.graph.value_info[:]
    for value in (*graph_model.graph.input, *graph_model.graph.output):
        if value.name in declared:
            value.type.tensor_type.shape.CopyFrom(declared[value.name])
    onnx.save(graph_model, str(path))


def export_model(model: nn.Module, tokenizers, config: dict[str, Any], output: str | Path, *,
                 quantize: str = "none", opset: int = DEFAULT_OPSET, overwrite: bool = False,
                 trainer_state: dict[str, Any] | None = None, source: str | None = None,
                 quantize_embeddings: bool = False) -> dict[str, Any]:
    """Export ``model`` with the tokenizers and run config it was trained with to the folder
    ``output`` (which must not exist, unless ``overwrite``); returns the manifest written, which
    keeps ``config``, ``trainer_state`` and ``source``.

    ``model`` is a :class:`~seq2seq.models.seq2seq.Seq2Seq` on the CPU (any encoder, decoder and
    scorer whose operations ONNX has). ``quantize`` is ``none`` (fp32 graphs) or ``int8``;
    ``quantize_embeddings``, with int8, puts the embedding tables in int8 too (the page of
    ``format=web``: a download half as large).

    Raises:
        ExportError: when a part of the model cannot be exported (its reason names the
            operation), the graphs do not reproduce the model, or an option is invalid.
        OSError: when the folder cannot be written.
    """
    check_export_options(output, quantize=quantize, overwrite=overwrite)
    started = time.perf_counter()
    model = model.eval()
    if quantize == "int8":
        # A decoder step's GRU traced as its products, which the quantizer reaches
        # (seq2seq.export.gru_products); a copy, so the caller's model stays as it was.
        model = gru_steps_as_products(model)
    with staged_folder(Path(output), overwrite=overwrite) as staging:
        manifest = build_manifest(staging, model, tokenizers, config, format_name=FORMAT_NAME,
                                  quantize=quantize, trainer_state=trainer_state, source=source)
        _write_graphs(model, staging, manifest, opset=opset)
        if quantize == "int8":
            quantize_graphs(staging, embeddings=quantize_embeddings)
            try:  # the int8 graphs load, and encode and decode a step at two sizes
                _observed_shapes(staging, manifest)
            except Exception as error:  # onnxruntime's own error types
                raise ExportError(f"the quantized graphs do not run: {_reason(error)}") from None
            manifest["export"]["int8_embeddings"] = quantize_embeddings
        write_manifest(staging, manifest, started=started)
    return manifest


def _write_graphs(model: nn.Module, folder: Path, manifest: dict[str, Any], *,
                  opset: int) -> None:
    """Write the fp32 graphs into ``folder``, checked against ``model``, and add their entries
    to ``manifest`` (``graphs``; the opset and the ONNX versions under ``export``)."""
    import onnx
    import onnxruntime

    src_vocab = manifest["vocabulary"]["source_size"]
    src, lengths = example_sources(TRACE_SENTENCES, TRACE_LENGTH, src_vocab, seed=0)
    prev_tokens, encoded, state = _step_inputs(model, src, lengths, TRACE_ROWS, seed=1,
                                               steps=TRACE_STEPS)
    state_names = tuple(state)
    encoded_values = (encoded.memory, encoded.mask, encoded.keys)
    # The open sizes: sentences (encoder) or decoder rows (step), the source length and the
    # decoded positions a cache holds.
    sentences, rows = torch.export.Dim(SENTENCES), torch.export.Dim(ROWS)
    length, steps = torch.export.Dim(SOURCE_LENGTH), torch.export.Dim(DECODED_POSITIONS)
    source_axes = length_axes(model, src_vocab)
    growing = growing_axes(model, prev_tokens, encoded, state)
    encoded_dynamic = [{0: rows, axis: length} for axis in source_axes]
    state_dynamic = tuple({0: rows, **{axis: steps for axis in axes}} for axes in growing.values())
    with torch.no_grad():
        _export(EncoderGraph(model, state_names).eval(), (src, lengths), folder / ENCODER_FILE,
                dynamic=({0: sentences, 1: length}, {0: sentences}),
                input_names=["src", "src_lengths"],
                output_names=encoder_output_names(state_names), opset=opset, what="encoder")
        _export(StepGraph(model, state_names).eval(),
                (prev_tokens, *encoded_values, *state.values()), folder / STEP_FILE,
                dynamic=({0: rows}, *encoded_dynamic, state_dynamic),
                input_names=["prev_tokens", *ENCODED_NAMES, *state_names],
                output_names=step_output_names(state_names),
                opset=opset, what="decoder step")
    open_axes = graph_open_axes(state_names, source_axes, growing)
    for name, axes in open_axes.items():
        declare_open_axes(folder / name, axes)

    manifest["graphs"] = {"encoder": ENCODER_FILE, "decoder_step": STEP_FILE,
                          "state": list(state_names)}
    manifest["export"].update(opset=opset, onnx_version=onnx.__version__,
                              onnxruntime_version=onnxruntime.__version__)
    check_against_model(model, folder, manifest)
    for name, observed in _observed_shapes(folder, manifest).items():
        declare_open_axes(folder / name, open_axes[name], observed)
