"""A run killed by SIGKILL in the middle of writing last.pt loses nothing: the previous last.pt
still loads, and the run resumes from it to the end."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from seq2seq.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]

# Runs train.py with torch.save replaced by one that, for the last.pt of step 20, writes half
# of the bytes, says so through a marker file and waits to be killed.
CHILD = """
import io, sys, time
from pathlib import Path
import torch

real_save = torch.save
MARKER = Path(sys.argv[1])

def save_then_hang(payload, handle, *args, **kwargs):
    state = payload.get("trainer_state", {}) if isinstance(payload, dict) else {}
    if state.get("step") == 20 and "optimizer" in payload:
        buffer = io.BytesIO()
        real_save(payload, buffer)
        data = buffer.getvalue()
        handle.write(data[: len(data) // 2])
        handle.flush()
        MARKER.touch()
        time.sleep(600)
    return real_save(payload, handle, *args, **kwargs)

torch.save = save_then_hang
sys.argv = ["train.py", *sys.argv[2:]]  # argv[1] is the marker file
from seq2seq.cli.train import main
main()
"""


@pytest.mark.slow
def test_sigkill_while_writing_last_pt_keeps_the_previous_one_resumable(
    tmp_path, tiny_train_config, run_python
):
    run_dir, marker = tmp_path / "run", tmp_path / "writing"
    overrides = tiny_train_config.overrides(**{
        "trainer.max_steps": 30, "trainer.save_every": 10, "trainer.valid_every": "null",
        "hydra.run.dir": run_dir})
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    script = tmp_path / "child.py"
    script.write_text(CHILD, encoding="utf-8")
    child = run_python.start([script, marker, *overrides], cwd=tmp_path, env=env)
    deadline = time.time() + 240
    while not marker.exists() and child.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    ended = child.result()
    output = ended.stdout + ended.stderr
    assert marker.exists(), f"the run never reached the write of step 20:\n{output[-3000:]}"

    last = run_dir / "checkpoints" / "last.pt"
    assert load_checkpoint(last)["trainer_state"]["step"] == 10  # the previous one, whole
    assert list(last.parent.glob(".last.pt.*.tmp")), "the half-written file should be beside it"

    resumed = run_python([ROOT / "train.py", *overrides, "trainer.resume=auto"], cwd=tmp_path,
                         env=env, timeout=240)
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, output[-3000:]
    assert f"resumed from {last} at step 10" in output
    assert load_checkpoint(last)["trainer_state"]["step"] == 30
    assert not list(last.parent.glob(".*.tmp")), "the resumed run cleans up the stale temporary"
