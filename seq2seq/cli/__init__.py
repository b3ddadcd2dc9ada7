"""Command-line entry points (Hydra apps) behind train.py, evaluate.py and translate.py."""
