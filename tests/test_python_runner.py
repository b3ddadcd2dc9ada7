"""tests/python_runner.py: a script run in a forked, preloaded process sees what ``python
script.py`` would give it (argv, folder, environment, streams, exit status)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

SCRIPT = """
import json, os, sys
report = {"argv": sys.argv, "cwd": os.getcwd(), "name": __name__, "path0": sys.path[0],
          "env": os.environ.get("RUNNER_TEST"), "stdin": sys.stdin.read(),
          "torch_preloaded": "torch" in sys.modules}
import helper  # from the PYTHONPATH entry
print(json.dumps(report))
print("to stderr: é", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def script(tmp_path):
    folder = tmp_path / "scripts"
    folder.mkdir()
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "helper.py").write_text("", encoding="utf-8")
    path = folder / "report.py"
    path.write_text(SCRIPT, encoding="utf-8")
    return path


def test_the_script_runs_as_main_with_its_own_argv_folder_environment_and_streams(
    run_python, script, tmp_path
):
    env = {"RUNNER_TEST": "yes", "PYTHONPATH": str(tmp_path / "lib")}
    result = run_python([script, "3", "--flag"], cwd=tmp_path, env=env, input="line\n")
    assert result.returncode == 3, result.stderr
    report = json.loads(result.stdout)
    assert report == {"argv": [str(script), "3", "--flag"], "cwd": str(tmp_path),
                      "name": "__main__", "path0": str(script.parent), "env": "yes",
                      "stdin": "line\n", "torch_preloaded": True}
    assert result.stderr == "to stderr: é\n"
    assert result.args == [sys.executable, str(script), "3", "--flag"]
    with pytest.raises(subprocess.CalledProcessError):
        run_python([script, "1"], cwd=tmp_path, env=env, check=True)


@pytest.mark.parametrize(("code", "status", "stderr"), [
    ("raise SystemExit('refused')", 1, "refused\n"),
    ("raise SystemExit(None)", 0, ""),
    ("raise RuntimeError('boom')", 1, "RuntimeError: boom\n"),
])
def test_exit_statuses_are_the_interpreters(run_python, tmp_path, code, status, stderr):
    path = tmp_path / "exit.py"
    path.write_text(code, encoding="utf-8")
    result = run_python([path])
    assert result.returncode == status
    assert result.stderr.endswith(stderr)
    if status and "RuntimeError" in code:
        assert result.stderr.startswith("Traceback (most recent call last):")


def test_a_started_script_can_be_killed_and_a_slow_one_times_out(run_python, tmp_path):
    path = tmp_path / "sleep.py"
    path.write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n",
                    encoding="utf-8")
    running = run_python.start([path])
    assert running.poll() is None
    running.send_signal(signal.SIGKILL)
    assert running.result().returncode == -signal.SIGKILL
    with pytest.raises(subprocess.TimeoutExpired):
        run_python([path], timeout=0.5)
