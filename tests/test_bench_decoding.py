"""scripts/bench_decoding.py: speed rows and the FLOP count per sentence, run as the user runs it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_decoding.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}


def test_flops_per_sentence_are_counted_and_grow_with_the_beam(tmp_path, trained_checkpoint,
                                                               run_python):
    shutil.copytree(trained_checkpoint.parents[1] / "corpus", tmp_path / "corpus")
    (tmp_path / "run").mkdir()
    shutil.copy(trained_checkpoint, tmp_path / "run" / "best.pt")
    args = ["--checkpoint", "run/best.pt", "--split", "valid", "--max-sentences", "6",
            "--beam-sizes", "1", "3", "--device", "cpu", "--num-threads", "1", "--count-flops"]
    result = run_python([SCRIPT, *args, "--json", "fp32.json"], cwd=tmp_path, env=ENV,
                        timeout=180)
    assert result.returncode == 0, result.stderr
    greedy, beam = json.loads((tmp_path / "fp32.json").read_text())["results"]
    assert greedy["search"] == "greedy" and beam["search"] == "beam3"
    assert greedy["flops_per_sentence"] > 0
    # Three beams run three decoder rows per sentence where greedy runs one.
    assert beam["flops_per_sentence"] > 1.5 * greedy["flops_per_sentence"]
    assert "MFLOP/sent" in result.stdout

    result = run_python(
        [SCRIPT, *args, "--quantize", "int8", "--json", "int8.json"],
        cwd=tmp_path, env=ENV, timeout=180,
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads((tmp_path / "int8.json").read_text())["results"]
    # The counter does not see quantized kernels: int8 rows are counted on the fp32 search.
    assert [row["flops_per_sentence"] for row in rows] == [
        greedy["flops_per_sentence"], beam["flops_per_sentence"]]
