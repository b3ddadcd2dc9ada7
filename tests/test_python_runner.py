"""tests/python_runner.py: a script run in a forked, preloaded process sees what ``python
script.py`` would give it (argv, folder, environment, streams, exit status and exit sequence),
checked against a real interpreter where the two can be compared."""

from __future__ import annotations

import json
import os
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


def test_a_module_runs_as_python_m_runs_it(run_python, tmp_path):
    package = tmp_path / "tools"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "report.py").write_text(
        "import json, sys\nprint(json.dumps({'argv': sys.argv, 'path0': sys.path[0], "
        "'name': __name__}))\nsys.exit(int(sys.argv[1]))\n", encoding="utf-8")
    args = ["-m", "tools.report", "3", "--flag"]
    real = subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    forked = run_python(args, cwd=tmp_path, timeout=60)
    assert forked.returncode == real.returncode == 3, forked.stderr
    assert json.loads(forked.stdout) == json.loads(real.stdout) == {
        "argv": [str(package / "report.py"), "3", "--flag"], "path0": str(tmp_path),
        "name": "__main__"}
    assert forked.args == [sys.executable, *args]


# Endings a script can have; each must give the same status, stdout and last stderr line as
# in a real interpreter.
ENDINGS = {
    "exit_message": "print('out', end='')\nraise SystemExit('refused')",
    "exit_none": "import sys\nsys.stdout.write('no newline')\nsys.exit(None)",
    "exit_code": "import sys\nprint('x', file=sys.stderr)\nsys.exit(7)",
    "exception": "raise RuntimeError('boom')",
    "interrupt": "raise KeyboardInterrupt",
    "thread_outlives_main": (
        "import threading, time\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), print('thread done'))).start()"),
    "atexit_handler": "import atexit\natexit.register(print, 'at exit')\nprint('main')",
    "executor_left_open": (
        "import time\nfrom concurrent.futures import ThreadPoolExecutor\n"
        "pool = ThreadPoolExecutor(1)\npool.submit(lambda: (time.sleep(0.3), print('task')))"),
    "stdin_echo": "import sys\nprint(sys.stdin.read().upper(), end='')",
    "unicode": "print('Ein Hund läuft. →')",
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_endings_match_a_real_interpreter(run_python, tmp_path, ending):
    path = tmp_path / f"{ending}.py"
    path.write_text(ENDINGS[ending], encoding="utf-8")
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    real = subprocess.run([sys.executable, str(path)], input="ein hund\n", capture_output=True,
                          text=True, encoding="utf-8", env=env, timeout=60)
    forked = run_python([path], input="ein hund\n", env=env, encoding="utf-8", timeout=60)
    assert forked.returncode == real.returncode
    assert forked.stdout == real.stdout
    assert forked.stderr.strip().splitlines()[-1:] == real.stderr.strip().splitlines()[-1:]


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
