"""Dynamic int8 quantization of a model for CPU decoding (``quantize=int8``).

``quantize_for_cpu(model, "int8")`` returns a quantized *copy* of the model (the one passed in
is left as it is) in which

- every ``nn.GRU`` / ``nn.LSTM`` (the encoder's, packed sequences included, and the decoder's
  step) becomes ``DynamicQuantizedGRU`` / ``DynamicQuantizedLSTM``; RNNs already folded by
  :mod:`seq2seq.inference.folding` (as the ``Translator`` does on the CPU) have their
  remaining products as ``nn.Linear`` layers instead, quantized as below, and their gate
  tables stay float (a folded encoder keeps its unfolded one, quantized, for small batches);
- every ``nn.Linear`` (attention projections, the decoder's bridge / combine / pre-output
  layers, the output layer ``generator``) becomes ``DynamicQuantizedLinear``.

Weights are stored as int8 (per-tensor scale); activations are quantized on the fly, per
call, and results come back as float32, so the search code does not change. What stays float:
the embeddings (``nn.Embedding``: dynamic quantization has no int8 embedding lookup), the
attention's softmax/sparsemax and any parameter a scorer uses directly rather than through an
``nn.Linear`` (e.g. a scale). With tied embeddings the output layer gets its own int8 copy of
the shared matrix; the embedding keeps the float one.

API: ``torch.ao.quantization.quantize_dynamic``, the one eager-mode API of PyTorch that
quantizes recurrent cells. It is **deprecated** (PyTorch 2.13 still ships it, with a
``DeprecationWarning`` saying it "will be removed in 2.10", and points to torchao's
``quantize_``, which quantizes ``nn.Linear`` only, not GRU/LSTM). Its warnings are silenced
here; when PyTorch drops it, ``quantize=int8`` fails with a clear error (and so does
``tests/test_quantize.py``) while ``quantize=none`` keeps working.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

QUANTIZE_MODES = ("none", "int8")


def _quantize_dynamic():
    """``torch.ao.quantization.quantize_dynamic``, or a RuntimeError saying it is gone."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torch.ao.quantization import quantize_dynamic
    except ImportError as error:
        raise RuntimeError(
            f"quantize=int8 needs torch.ao.quantization.quantize_dynamic, which PyTorch "
            f"{torch.__version__} no longer has (deprecated since 2.10): use quantize=none"
        ) from error
    return quantize_dynamic


def check_quantize_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`QUANTIZE_MODES`, else a one-line ValueError."""
    if mode not in QUANTIZE_MODES:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZE_MODES)}, got {mode!r}")
    return mode


def quantize_for_cpu(model: nn.Module, mode: str, device: str | torch.device = "cpu") -> nn.Module:
    """The model to decode with: ``model`` itself (``none``) or an int8 copy (``int8``).

    Args:
        model: a :class:`~seq2seq.models.seq2seq.Seq2Seq` (any ``nn.Module``) on the CPU.
        mode: ``none`` or ``int8``.
        device: where the model will run; int8 needs ``cpu``.

    Returns:
        ``model`` unchanged for ``none``; for ``int8`` a quantized copy in eval mode.

    Raises:
        ValueError: on an unknown mode, or ``int8`` on a device other than the CPU.
        RuntimeError: when this PyTorch no longer has ``quantize_dynamic``.
    """
    if check_quantize_mode(mode) == "none":
        return model
    device = torch.device(device)
    if device.type != "cpu":
        raise ValueError(
            f"quantize={mode} runs on the CPU only, got device={device}: add device=cpu"
        )
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ValueError(f"quantize={mode} needs the model on the CPU")
    quantize_dynamic = _quantize_dynamic()
    float_model = copy.deepcopy(model).eval()
    with warnings.catch_warnings():
        # The API's own deprecation warnings (see the module docstring), once per load.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        quantized = quantize_dynamic(
            float_model, {nn.Linear, nn.GRU, nn.LSTM}, dtype=torch.qint8, inplace=True
        )
    return quantized.eval()
