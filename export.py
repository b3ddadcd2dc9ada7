"""Export a checkpoint for ONNX Runtime: ``python export.py checkpoint=PATH output=DIR`` (see
seq2seq/cli/export.py)."""

from seq2seq.cli.export import main

if __name__ == "__main__":
    main()
