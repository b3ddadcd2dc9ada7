"""Command-line entry points (Hydra apps) behind train.py, evaluate.py and translate.py."""

from pathlib import Path

# An absolute path: Hydra would otherwise resolve a relative config_path against the
# importing package (seq2seq.cli), which fails when the app is not run as a script.
CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "configs")
