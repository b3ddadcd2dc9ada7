"""seq2seq: attention-based neural machine translation on PyTorch."""

__version__ = "0.1.0"
