"""seq2seq/device.py: the oneDNN kernel-cache bound that training sets."""

from __future__ import annotations

import os
import subprocess
import sys

from seq2seq.device import ONEDNN_CACHE_ENV, TRAINING_ONEDNN_CACHE, bound_onednn_cache


def test_bound_onednn_cache_sets_a_default_and_keeps_the_users_choice(monkeypatch):
    monkeypatch.delenv(ONEDNN_CACHE_ENV, raising=False)
    bound_onednn_cache()
    assert os.environ[ONEDNN_CACHE_ENV] == str(TRAINING_ONEDNN_CACHE)
    monkeypatch.setenv(ONEDNN_CACHE_ENV, "256")
    bound_onednn_cache()
    assert os.environ[ONEDNN_CACHE_ENV] == "256"


def test_the_training_entry_point_bounds_the_cache_on_import():
    code = ("import os; os.environ.pop('ONEDNN_PRIMITIVE_CACHE_CAPACITY', None); "
            "import seq2seq.cli.train; print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(TRAINING_ONEDNN_CACHE)
