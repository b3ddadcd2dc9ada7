"""Runs the project's scripts in processes forked from one that has already imported torch.

A ``python script.py`` started by a test spends ~2.5 s of CPU importing torch before its first
line of work, and a training run ~2.5 s more on ``torch._dynamo`` (the optimizers import it
on first use in torch 2.13); with some fifty such runs that was over a third of the suite's
CPU time on the 2-core AVX2 EPYC. A ``multiprocessing`` forkserver imports those modules once
per pytest worker and forks a fresh process for each run. The run gets its own argv, working
folder, environment, stdin/stdout/stderr, signals and exit status, as with ``subprocess``,
and the script runs as ``__main__`` (``runpy``), so it takes the path it takes for a user.

What a preloaded process cannot show stays with real interpreters: which modules a script
imports and when (the tests that no tool loads torch before refusing a bad option, and that
the oneDNN cache bounds are set before torch loads), console scripts and installed wheels,
``python -m`` and ``torchrun``. Environment variables read only when the interpreter or torch
start (``PYTHONHASHSEED``, ``OMP_NUM_THREADS``) keep the forkserver's values; it runs with
``OMP_NUM_THREADS=1``, as every test's tools do.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

PRELOADED_MODULES = ["numpy", "torch", "torch._dynamo", "omegaconf", "hydra", "sentencepiece",
                     "sacrebleu"]


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
    import atexit
    import logging
    import runpy
    import threading
    import traceback

    atexit._clear()  # the forkserver's own exit handlers are not the script's
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, (path, flags) in enumerate(zip(streams, (os.O_RDONLY, os.O_WRONLY, os.O_WRONLY),
                                           strict=True)):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    # Open for the life of the process, as an interpreter's own streams are.
    encoding = env.get("PYTHONIOENCODING", "").split(":")[0] or "utf-8"
    line_buffered = 1 if env.get("PYTHONUNBUFFERED") else -1
    sys.stdin = sys.__stdin__ = open(0, encoding=encoding, closefd=False)  # noqa: SIM115
    sys.stdout = sys.__stdout__ = open(1, "w", encoding=encoding, closefd=False,  # noqa: SIM115
                                       buffering=line_buffered)
    sys.stderr = sys.__stderr__ = open(2, "w", encoding=encoding,  # noqa: SIM115
                                       errors="backslashreplace", closefd=False, buffering=1)
    sys.argv = list(argv)
    extra_path = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:] = [str(Path(argv[0]).resolve().parent), *extra_path, *sys_path]

    status = 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as stop:
        status = _exit_status(stop.code)
    except BaseException:
        traceback.print_exc()
        status = 1
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a script may have closed its stream
            stream.flush()
    os._exit(status)


class RunningScript:
    """A script started by ``PreloadedPython.start``: the parts of ``subprocess.Popen`` the
    tests use. Its stdout and stderr go to files, read by ``result()`` once it has ended."""

    def __init__(self, process: multiprocessing.process.BaseProcess, argv: list[str],
                 folder: tempfile.TemporaryDirectory) -> None:
        self._process, self._argv, self._folder = process, argv, folder
        self.pid = process.pid

    def _output(self, name: str) -> str:
        return Path(self._folder.name, name).read_text(encoding="utf-8", errors="replace")

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
            raise subprocess.TimeoutExpired(self._argv, timeout, self._output("stdout"),
                                            self._output("stderr"))
        return self._process.exitcode

    def result(self) -> subprocess.CompletedProcess:
        """Stdout and stderr of the ended script (a negative status: the signal that ended it,
        as subprocess reports it); its temporary folder is removed."""
        status = self.wait()
        result = subprocess.CompletedProcess([sys.executable, *self._argv], status,
                                             self._output("stdout"), self._output("stderr"))
        self._folder.cleanup()
        return result


class PreloadedPython:
    """``run([script, *args], ...)``, or calling the object, is like
    ``subprocess.run([sys.executable, script, *args], capture_output=True, text=True, ...)``;
    ``start`` like ``subprocess.Popen``. Both in a process forked with torch already imported."""

    def __init__(self, scratch: Path) -> None:
        self._scratch = scratch
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(PRELOADED_MODULES)
        # A fresh interpreter's module path, without the pytest worker's additions.
        clean = subprocess.run([sys.executable, "-c", "import sys; print('\\n'.join(sys.path[1:]))"],
                               capture_output=True, text=True, check=True, env=os.environ)
        self._sys_path = clean.stdout.splitlines()
        self._started = False

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
              env: Mapping[str, str] | None = None, input: str = "") -> RunningScript:
        if not self._started:
            self._start_forkserver()
        argv = [str(arg) for arg in argv]
        cwd = str(cwd if cwd is not None else os.getcwd())
        env = dict(os.environ if env is None else env)
        folder = tempfile.TemporaryDirectory(dir=self._scratch)
        streams = tuple(str(Path(folder.name, name)) for name in ("stdin", "stdout", "stderr"))
        Path(streams[0]).write_text(input, encoding="utf-8")
        for path in streams[1:]:
            Path(path).touch()
        process = self._context.Process(target=_run_as_main,
                                        args=(argv, cwd, env, self._sys_path, streams))
        process.start()
        return RunningScript(process, argv, folder)

    def run(self, argv: Sequence[str | os.PathLike], *, cwd: str | os.PathLike | None = None,
            env: Mapping[str, str] | None = None, input: str = "",
            timeout: float | None = None, check: bool = False) -> subprocess.CompletedProcess:
        running = self.start(argv, cwd=cwd, env=env, input=input)
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
