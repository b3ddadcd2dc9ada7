"""Runs the project's scripts in processes forked from one that has already imported torch.

A ``python script.py`` started by a test spends ~2.5 s of CPU importing torch before its first
line of work, and a training run ~2.5 s more on ``torch._dynamo`` (the optimizers import it
on first use in torch 2.13); with some fifty such runs that was over a third of the suite's
CPU time on the 2-core AVX2 EPYC. A ``multiprocessing`` forkserver imports those modules once
per pytest worker and forks a fresh process for each run. The run gets its own argv, working
folder, environment, stdin/stdout/stderr, exit status (a signal's too) and exit sequence
(non-daemon threads joined, atexit handlers run), and the script runs as ``__main__``
(``runpy``; ``["-m", module, ...]`` as ``python -m`` runs it), so it takes the path it takes
for a user. tests/test_python_runner.py runs the same scripts both ways and compares.

Where such a process differs from a fresh interpreter:

- modules are already imported: which modules a script imports and when is shown with real
  interpreters (the tests that no tool loads torch before refusing a bad option, and that the
  oneDNN cache bounds are set before torch loads), as are console scripts, the installed wheel
  and ``torchrun``;
- what is read once at interpreter or library start keeps the forkserver's value: the hash seed
  and numpy's global random state (the same in every run; the scripts seed their own
  generators), ``OMP_NUM_THREADS`` (the forkserver starts with 1, so a run whose environment
  does not set it still gets one OpenMP thread where a fresh interpreter gets one per core;
  every script sets its own thread count from its config);
- ``multiprocessing`` sees a child process (``parent_process()`` is set); the default start
  method is put back to the platform's.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import io
import locale
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

PRELOADED_MODULES = ["numpy", "torch", "torch._dynamo", "omegaconf", "hydra", "sentencepiece",
                     "sacrebleu"]


def _open_streams(paths: tuple[str, str, str], env: Mapping[str, str]) -> None:
    """Files as fds 0-2 and text streams over them, configured as the interpreter would."""
    for fd, (path, flags) in enumerate(zip(paths, (os.O_RDONLY, os.O_WRONLY, os.O_WRONLY),
                                           strict=True)):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    name, _, errors = env.get("PYTHONIOENCODING", "").partition(":")
    encoding = name or locale.getpreferredencoding(False)
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    # Open for the life of the process, as an interpreter's own streams are: stderr always
    # line-buffered, stdout block-buffered when it is a file, both unbuffered with -u.
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(
        open(0, "rb", closefd=False), encoding=encoding, errors=errors or "strict")  # noqa: SIM115
    for fd, attribute, stream_errors, line_buffering in (
            (1, "stdout", errors or "strict", False), (2, "stderr", "backslashreplace", True)):
        binary = open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)  # noqa: SIM115
        stream = io.TextIOWrapper(binary, encoding=encoding, errors=stream_errors,
                                  line_buffering=line_buffering, write_through=unbuffered)
        setattr(sys, attribute, stream)
        setattr(sys, f"__{attribute}__", stream)


def _exit_status(code: object) -> int:
    """The exit status Python gives ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _run_as_main(argv: list[str], cwd: str, env: dict[str, str], sys_path: list[str],
                 streams: tuple[str, str, str]) -> None:
    """Forked child: become ``python argv[0] argv[1:]`` run in `cwd` with `env`, then exit."""
    _open_streams(streams, env)  # first, so that anything below fails visibly
    multiprocessing.set_start_method(None, force=True)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    extra_path = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    module = argv[1] if argv[0] == "-m" else None
    if module is None:
        sys.argv = list(argv)
        sys.path[:] = [str(Path(argv[0]).resolve().parent), *extra_path, *sys_path]
    else:  # ``python -m module``: the working folder first; run_module sets argv[0]
        sys.argv = [module, *argv[2:]]
        sys.path[:] = [cwd, *extra_path, *sys_path]

    status, interrupted = 0, False
    try:
        if module is None:
            runpy.run_path(argv[0], run_name="__main__")
        else:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        status = _exit_status(stop.code)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status, interrupted = 1, isinstance(sys.exc_info()[1], KeyboardInterrupt)
    # The interpreter's exit sequence: non-daemon threads (and concurrent.futures' pools),
    # atexit handlers, a last collection, flushed streams.
    threading._shutdown()
    atexit._run_exitfuncs()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a script may have closed its stream
            stream.flush()
    if interrupted:  # an uncaught Ctrl-C ends the interpreter by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


class RunningScript:
    """A script started by ``PreloadedPython.start``: the parts of ``subprocess.Popen`` the
    tests use. Its stdout and stderr go to files, read by ``result()`` once it has ended."""

    def __init__(self, process: multiprocessing.process.BaseProcess, argv: list[str],
                 folder: tempfile.TemporaryDirectory, encoding: str) -> None:
        self._process, self._argv, self._folder = process, argv, folder
        self._encoding = encoding
        self._result: subprocess.CompletedProcess | None = None
        self.pid = process.pid

    def _output(self, name: str) -> str:
        path = Path(self._folder.name, name)  # absent when the stream was a terminal
        return path.read_text(encoding=self._encoding) if path.is_file() else ""

    def poll(self) -> int | None:
        return self._process.exitcode

    def send_signal(self, number: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, number)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self._argv, timeout)
        return self._process.exitcode

    def result(self) -> subprocess.CompletedProcess:
        """Stdout and stderr of the ended script (a negative status: the signal that ended it,
        as subprocess reports it). Waits for the end; its temporary folder is then removed."""
        if self._result is None:
            status = self.wait()
            self._result = subprocess.CompletedProcess(
                [sys.executable, *self._argv], status, self._output("stdout"),
                self._output("stderr"))
            self._folder.cleanup()
        return self._result


class PreloadedPython:
    """``run([script, *args], ...)``, or calling the object, is like
    ``subprocess.run([sys.executable, script, *args], capture_output=True, text=True, ...)``
    (``run(["-m", module, *args])``: like ``python -m module args``);
    ``start`` like ``subprocess.Popen``. Both in a process forked with torch already imported.
    ``stop_all()`` kills and reaps every script still running."""

    def __init__(self, scratch: Path) -> None:
        self._scratch = scratch
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(PRELOADED_MODULES)
        # A fresh interpreter's module path, without the pytest process's additions.
        environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        clean = subprocess.run([sys.executable, "-c", "import sys; print('\\n'.join(sys.path[1:]))"],
                               capture_output=True, text=True, check=True, env=environment)
        self._sys_path = clean.stdout.splitlines()
        self._started = False
        self._running: list[RunningScript] = []

    def _start_forkserver(self) -> None:
        # OMP_NUM_THREADS is read when torch's OpenMP runtime loads, that is in the forkserver.
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            from multiprocessing import forkserver

            forkserver.ensure_running()
        finally:
            if saved is None:
                del os.environ["OMP_NUM_THREADS"]
            else:
                os.environ["OMP_NUM_THREADS"] = saved
        self._started = True

    def start(self, argv: Sequence[str | os.PathLike], *, cwd: str | os.PathLike | None = None,
              env: Mapping[str, str] | None = None, input: str | bytes = "",
              encoding: str | None = None, tty: str | None = None) -> RunningScript:
        """``tty``: a terminal device (``os.ttyname`` of a pty) for stdout and stderr."""
        argv = [os.fspath(arg) for arg in argv]
        cwd = os.fspath(cwd if cwd is not None else os.getcwd())
        env = dict(os.environ if env is None else env)
        # What subprocess refuses in the caller, refused here too (not inside the child).
        if not Path(cwd).is_dir():
            raise FileNotFoundError(f"no such folder: {cwd!r}")
        if not all(isinstance(key, str) and isinstance(value, str) for key, value in env.items()):
            raise TypeError("env keys and values must be str")
        if not self._started:
            self._start_forkserver()
        self._running = [script for script in self._running if script.poll() is None]
        folder = tempfile.TemporaryDirectory(dir=self._scratch)
        streams = tuple(str(Path(folder.name, name)) for name in ("stdin", "stdout", "stderr"))
        encoding = encoding or locale.getpreferredencoding(False)
        if isinstance(input, bytes):  # raw bytes: what a text stream could not carry
            Path(streams[0]).write_bytes(input)
        else:
            Path(streams[0]).write_text(input, encoding=encoding)
        for path in streams[1:]:
            Path(path).touch()
        if tty is not None:
            streams = (streams[0], tty, tty)
        process = self._context.Process(target=_run_as_main,
                                        args=(argv, cwd, env, self._sys_path, streams))
        process.start()
        script = RunningScript(process, argv, folder, encoding)
        self._running.append(script)
        return script

    def run(self, argv: Sequence[str | os.PathLike], *, cwd: str | os.PathLike | None = None,
            env: Mapping[str, str] | None = None, input: str | bytes = "",
            encoding: str | None = None, timeout: float | None = None, check: bool = False) -> subprocess.CompletedProcess:
        running = self.start(argv, cwd=cwd, env=env, input=input, encoding=encoding)
        try:
            running.wait(timeout)
        except subprocess.TimeoutExpired:
            running.kill()
            running.result()
            raise
        result = running.result()
        if check:
            result.check_returncode()
        return result

    __call__ = run

    def stop_all(self) -> None:
        for script in self._running:
            script.kill()
            script.result()
        self._running = []
