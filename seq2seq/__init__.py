"""seq2seq: attention-based neural machine translation on PyTorch."""

from pathlib import Path

__version__ = "0.1.0"

# The Hydra config tree ships inside the package, so an installed wheel finds it too.
CONFIG_DIR = Path(__file__).resolve().parent / "configs"
