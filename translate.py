"""Translate text: ``python translate.py checkpoint=PATH [overrides]`` (see seq2seq/cli/translate.py)."""

from seq2seq.cli.translate import main

if __name__ == "__main__":
    main()
