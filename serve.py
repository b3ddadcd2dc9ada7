"""Serve models over HTTP: ``python serve.py checkpoint=PATH [overrides]`` (see seq2seq/cli/serve.py)."""

from seq2seq.cli.serve import main

if __name__ == "__main__":
    main()
