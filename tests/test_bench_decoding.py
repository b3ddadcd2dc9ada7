"""benchmarks.bench_decoding: speed rows and the FLOP count per sentence, run as make bench
runs it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOL = ["-m", "benchmarks.bench_decoding"]
# PYTHONPATH: `benchmarks` is found in the checkout (make bench runs it from there).
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8", "PYTHONPATH": str(ROOT)}


def test_flops_per_sentence_are_counted_and_grow_with_the_beam(tmp_path, trained_checkpoint,
                                                               run_python):
    shutil.copytree(trained_checkpoint.parents[1] / "corpus", tmp_path / "corpus")
    (tmp_path / "run").mkdir()
    shutil.copy(trained_checkpoint, tmp_path / "run" / "best.pt")
    args = ["--checkpoint", "run/best.pt", "--split", "valid", "--max-sentences", "6",
            "--beam-sizes", "1", "3", "--device", "cpu", "--num-threads", "1", "--count-flops"]
    result = run_python([*TOOL, *args, "--json", "fp32.json"], cwd=tmp_path, env=ENV,
                        timeout=180)
    assert result.returncode == 0, result.stderr
    greedy, beam = json.loads((tmp_path / "fp32.json").read_text())["results"]
    assert greedy["search"] == "greedy" and beam["search"] == "beam3"
    assert greedy["flops_per_sentence"] > 0
    # Three beams run three decoder rows per sentence where greedy runs one.
    assert beam["flops_per_sentence"] > 1.5 * greedy["flops_per_sentence"]
    assert "MFLOP/sent" in result.stdout
