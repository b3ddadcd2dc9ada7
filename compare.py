"""Compare training runs: ``python compare.py multirun/DATE/TIME [split=test ...]`` (see seq2seq/cli/compare.py)."""

from seq2seq.cli.compare import main

if __name__ == "__main__":
    main()
