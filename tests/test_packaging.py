"""The package as `pip install .` ships it: a wheel with every config, console scripts that run
from any folder, with the installed code and configs (not this checkout's).

The wheel is built offline (--no-deps --no-build-isolation) from a copy of the sources, so the
checkout gets no build/ or egg-info leftovers and no stale build/lib file can slip into the
wheel. It is installed with `pip install --no-deps --target SITE`: torch and the other
dependencies come from the running environment, and PYTHONPATH=SITE puts the wheel's
`seq2seq` ahead of the editable install of this checkout, which each test double-checks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ATTENTION_TARGET = "_target_: "  # then the scorer's registry name


def run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None):
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, encoding="utf-8", timeout=120
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of pyproject.toml, README.md, seq2seq/ and the top-level
    configs symlink into it."""
    # Asked in a child process: even find_spec("pip") in this one makes setuptools' distutils
    # shim stand down for the rest of the worker, and torch.compile's C++ builds then fail.
    for module in ("pip", "setuptools"):
        found = run([sys.executable, "-c", f"import {module}"], cwd=ROOT)
        if found.returncode != 0:
            pytest.skip(f"building the wheel offline needs {module} in this environment")
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "seq2seq", source / "seq2seq", ignore=shutil.ignore_patterns("__pycache__")
    )
    (source / "configs").symlink_to(Path("seq2seq") / "configs", target_is_directory=True)
    wheels = tmp_path_factory.mktemp("wheels")
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    result = run([*pip_wheel, "--no-input", "-q", "-w", str(wheels), str(source)], cwd=wheels)
    assert result.returncode == 0, result.stdout + result.stderr
    (built,) = wheels.glob("seq2seq-*.whl")
    return built


@pytest.fixture(scope="module")
def site(wheel: Path, tmp_path_factory) -> Path:
    """A folder the wheel is installed into (package, dist-info, bin/ console scripts)."""
    target = tmp_path_factory.mktemp("site")
    pip_install = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile"]
    result = run(
        [*pip_install, "--no-input", "-q", "--target", str(target), str(wheel)], cwd=target
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return target


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """An empty working folder outside the checkout."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    return folder


def installed_env(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}


def test_wheel_ships_every_config(wheel):
    """Once, inside the package (the top-level configs/ is a symlink to it)."""
    shipped = {name for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".yaml")}
    configs = ROOT / "seq2seq" / "configs"
    expected = {path.relative_to(ROOT).as_posix() for path in configs.rglob("*.yaml")}
    assert "seq2seq/configs/train.yaml" in expected
    assert "seq2seq/configs/hydra/job_logging/stderr.yaml" in expected
    assert shipped == expected


def test_wheel_ships_the_serving_page(wheel):
    shipped = set(zipfile.ZipFile(wheel).namelist())
    static = ROOT / "seq2seq" / "serving" / "static"
    expected = {path.relative_to(ROOT).as_posix() for path in static.iterdir() if path.is_file()}
    assert "seq2seq/serving/static/index.html" in expected
    assert expected <= shipped, sorted(expected - shipped)


def test_installed_package_is_the_wheel(site, elsewhere):
    code = "import seq2seq; print(seq2seq.__file__); print(seq2seq.CONFIG_DIR)"
    result = run([sys.executable, "-c", code], cwd=elsewhere, env=installed_env(site))
    assert result.returncode == 0, result.stderr
    module, config_dir = (Path(line) for line in result.stdout.split())
    assert module == site / "seq2seq" / "__init__.py"
    assert config_dir == site / "seq2seq" / "configs"


def test_user_tools_are_console_scripts(site, elsewhere):
    env = installed_env(site)
    for script in ("seq2seq-tune-decoding", "seq2seq-average", "seq2seq-build-shortlist",
                   "seq2seq-plot-curves"):
        result = run([str(site / "bin" / script), "--help"], cwd=elsewhere, env=env)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"usage: {script} ")
    assert list(elsewhere.iterdir()) == []


def test_console_scripts_run_from_any_folder(site, elsewhere):
    env = installed_env(site)
    bin_dir = site / "bin"

    train = run([str(bin_dir / "seq2seq-train"), "--cfg", "job"], cwd=elsewhere, env=env)
    assert train.returncode == 0, train.stderr
    assert f"{ATTENTION_TARGET}additive" in train.stdout
    assert "_target_: rnn" in train.stdout

    # Hydra's config search path: the installed configs, not the checkout's.
    searchpath = run(
        [str(bin_dir / "seq2seq-translate"), "--info", "searchpath"], cwd=elsewhere, env=env
    )
    assert searchpath.returncode == 0, searchpath.stderr
    assert f"file://{site / 'seq2seq' / 'configs'}" in searchpath.stdout
    assert str(ROOT) not in searchpath.stdout

    for script in ("seq2seq-translate", "seq2seq-evaluate"):
        result = run([str(bin_dir / script), "--cfg", "job"], cwd=elsewhere, env=env)
        assert result.returncode == 0, result.stderr
        assert "checkpoint: ???" in result.stdout and "beam_size: 5" in result.stdout
    prepare = run([str(bin_dir / "seq2seq-prepare-data"), "--cfg", "job"], cwd=elsewhere, env=env)
    assert prepare.returncode == 0, prepare.stderr
    assert "tokenizer:" in prepare.stdout

    assert list(elsewhere.iterdir()) == []  # no outputs/, .hydra/ or log files


def test_root_script_still_composes_the_config(elsewhere):
    result = run(
        [sys.executable, str(ROOT / "train.py"), "--cfg", "job", "model/attention=dot"],
        cwd=elsewhere,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert f"{ATTENTION_TARGET}dot\n" in result.stdout  # a group override is composed in
    assert list(elsewhere.iterdir()) == []
