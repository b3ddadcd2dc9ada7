"""A folder that holds a run is never silently reused: refused unchanged, continued, or emptied."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from seq2seq.training.run_folder import RunFolderError, claim_run_folder, holds_run

ROOT = Path(__file__).resolve().parents[1]


def make_old_run(folder: Path) -> dict[Path, bytes]:
    """A run folder as train.py leaves it (fake contents); returns every file's bytes."""
    files = {
        "config.yaml": b"model: old\n",
        "train.log": b"[INFO] the old run's log\n",
        "checkpoints/best.pt": b"old best",
        "checkpoints/last.pt": b"old last",
        "checkpoints/step0000100-bleu12.34.pt": b"old step",
        "validation/step0000100.hyp": b"old hypotheses\n",
        ".hydra/config.yaml": b"old: snapshot\n",
        ".hydra/hydra.yaml": b"hydra: {}\n",
    }
    for name, data in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return snapshot(folder)


def snapshot(folder: Path) -> dict[Path, bytes]:
    return {path.relative_to(folder): path.read_bytes()
            for path in sorted(folder.rglob("*")) if path.is_file()}


def test_a_fresh_or_empty_folder_is_not_a_run(tmp_path):
    assert not holds_run(tmp_path / "missing")
    (tmp_path / "train.log").touch()  # Hydra opens the log before the job starts
    assert not holds_run(tmp_path)
    assert claim_run_folder(tmp_path, resume=None, overwrite=False) == []
    (tmp_path / "notes.txt").write_text("a user's own file")
    (tmp_path / "config.yaml").write_text("a user's own config")
    assert not holds_run(tmp_path)
    # A start that failed in the data stage left Hydra's snapshot and a log: not a run, so
    # the corrected command may use the folder.
    (tmp_path / ".hydra").mkdir()
    (tmp_path / "train.log").write_text("[ERROR] the data file is missing\n")
    (tmp_path / "config.yaml").unlink()
    assert not holds_run(tmp_path)


def test_resume_auto_refuses_checkpoints_it_cannot_continue(tmp_path):
    make_old_run(tmp_path)
    (tmp_path / "checkpoints" / "last.pt").unlink()  # killed before its first save
    with pytest.raises(RunFolderError, match="no checkpoints/last.pt to continue from"):
        claim_run_folder(tmp_path, resume="auto", overwrite=False)


def test_reuse_is_refused_with_both_ways_out_and_nothing_changes(tmp_path):
    before = make_old_run(tmp_path)
    with pytest.raises(RunFolderError) as refused:
        claim_run_folder(tmp_path, resume=None, overwrite=False)
    message = str(refused.value)
    assert "\n" not in message
    assert "trainer.resume=auto" in message and "trainer.overwrite=true" in message
    assert snapshot(tmp_path) == before


def test_resume_continues_and_keeps_everything(tmp_path):
    before = make_old_run(tmp_path)
    assert claim_run_folder(tmp_path, resume="auto", overwrite=False) == []
    last = tmp_path / "checkpoints" / "last.pt"
    assert claim_run_folder(tmp_path, resume=str(last), overwrite=False) == []
    assert snapshot(tmp_path) == before
    # A checkpoint of another run is not a continuation of this one.
    with pytest.raises(RunFolderError):
        claim_run_folder(tmp_path, resume=str(tmp_path.parent / "other" / "last.pt"),
                         overwrite=False)


def test_overwrite_removes_the_old_run_but_not_a_users_files(tmp_path):
    make_old_run(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    removed = claim_run_folder(tmp_path, resume=None, overwrite=True)
    assert set(removed) >= {"checkpoints/", "validation/", ".hydra/", "config.yaml", "train.log"}
    assert snapshot(tmp_path) == {Path("notes.txt"): b"mine", Path("train.log"): b""}
    with pytest.raises(RunFolderError, match="contradict"):
        claim_run_folder(tmp_path, resume="auto", overwrite=True)


def test_train_py_refuses_a_used_folder_before_anything_changes(tiny_train_config, tmp_path,
                                                                run_python):
    run_dir = tmp_path / "runs" / "a"
    before = make_old_run(run_dir)
    overrides = tiny_train_config.overrides(**{"trainer.max_steps": 4, "trainer.valid_every": 2,
                                               "trainer.save_every": 2,
                                               "hydra.run.dir": run_dir})
    refused = run_python([ROOT / "train.py", *overrides, "model/attention=dot"], cwd=tmp_path,
                         timeout=120)
    assert refused.returncode == 1
    error_lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert error_lines == [f"error: {run_dir} already holds a training run; continue it with "
                           "trainer.resume=auto, start it over with trainer.overwrite=true (its "
                           "checkpoints are deleted), or give another hydra.run.dir"], refused.stderr
    assert snapshot(run_dir) == before  # byte for byte, and nothing added
    assert not (tmp_path / "data").exists(), "refused before the data stage"

    started_over = run_python([ROOT / "train.py", *overrides, "trainer.overwrite=true"],
                              cwd=tmp_path, timeout=240)
    assert started_over.returncode == 0, started_over.stdout[-2000:] + started_over.stderr[-2000:]
    assert not (run_dir / "checkpoints" / "step0000100-bleu12.34.pt").exists()
    assert b"old" not in (run_dir / "config.yaml").read_bytes()
    log = (run_dir / "train.log").read_text()
    assert "the old run's log" not in log and "removed the earlier run's" in log
    # train.py writes the Hydra snapshot itself, after the check (compare.py reads it).
    assert "runtime" in (run_dir / ".hydra" / "hydra.yaml").read_text()
    assert (run_dir / ".hydra" / "overrides.yaml").is_file()


def test_on_a_terminal_the_bar_follows_max_time_and_train_log_keeps_the_loss_lines(
        tiny_train_config, tmp_path, run_python):
    """train.py with stdout and stderr on a pseudo-terminal, as a user sees it."""
    import fcntl
    import os
    import pty
    import struct
    import termios
    import threading

    run_dir = tmp_path / "run"
    overrides = tiny_train_config.overrides(**{
        # max_epochs left set: the bar follows whichever limit ends first.
        "trainer.max_steps": "null", "trainer.max_epochs": 20, "trainer.max_time": 0.04,
        "trainer.valid_every": "null", "trainer.progress_bar": "auto", "hydra.run.dir": run_dir})
    master, slave = pty.openpty()
    # A terminal 120 columns wide: tqdm draws nothing on one of width 0 (a new pty's size).
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    chunks: list[bytes] = []

    def drain() -> None:  # a pty's buffer is small: read while the run writes
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        running = run_python.start([ROOT / "train.py", *overrides], cwd=tmp_path,
                                   env={**os.environ, "OMP_NUM_THREADS": "1", "TERM": "xterm"},
                                   tty=os.ttyname(slave))
        running.wait(240)
        result = running.result()
    finally:
        os.close(slave)
        reader.join(timeout=5)
        os.close(master)
    screen = b"".join(chunks).decode("utf-8", "replace")
    assert result.returncode == 0, screen[-3000:]
    log = (run_dir / "train.log").read_text()
    assert re.search(r"step \d+ epoch \d+: loss", log), log[-2000:]
    assert "% of the budget" in screen, screen[-2000:]  # the bar follows max_time
    assert "Seq2Seq(" in log and "Seq2Seq(" not in screen  # the printout: the file only
    assert re.search(r"model: [\d,]+ parameters", screen)
    for segment in re.split(r"[\r\n]", screen):  # no log line printed onto the bar's line
        assert not ("% of the budget" in segment and "[INFO]" in segment), segment
