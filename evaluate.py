"""Score checkpoints: ``python evaluate.py checkpoint=PATH [overrides]`` (see seq2seq/cli/evaluate.py)."""

from seq2seq.cli.evaluate import main

if __name__ == "__main__":
    main()
