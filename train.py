"""Train a translation model: ``python train.py [hydra overrides]`` (see seq2seq/cli/train.py)."""

from seq2seq.cli.train import main

if __name__ == "__main__":
    main()
