"""benchmarks.probe_training_memory: memory reports during a tiny training run."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_reports_heap_and_mappings_every_n_steps(tiny_train_config, tmp_path, run_python):
    overrides = tiny_train_config.overrides(**{"trainer.max_steps": 4, "trainer.valid_every": 4,
                                               "trainer.valid.max_sentences": 4})
    result = run_python(
        ["-m", "benchmarks.probe_training_memory", *overrides,
         "--report-every", "2", "--trim-every", "1", "--run-dir", tmp_path / "run"],
        cwd=tmp_path, timeout=180,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reports = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    assert [line.split(":")[0] for line in reports] == ["step 2", "step 4"]
    assert all("heap in use" in line and "freed but kept" in line for line in reports)
    assert "[heap]" in result.stdout  # the largest mappings are listed
    assert (tmp_path / "run" / "checkpoints" / "last.pt").is_file()  # it trained as train.py does
