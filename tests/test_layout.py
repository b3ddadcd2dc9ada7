"""The house rules of the layout, checked on the sources (parsed with `ast`, never imported).

- The library layers below training (`seq2seq.data`, `seq2seq.models`, `seq2seq.ops`,
  `seq2seq.inference`) import neither `seq2seq.training` nor `seq2seq.cli`, not even inside a
  function: what they share with training lives in a module of their own (`seq2seq.device`,
  `seq2seq.checkpoint`...).
- `seq2seq.models` reads like the papers: the speed kernels of `seq2seq.ops` sit above it and
  neither it nor `seq2seq.export` (whose graphs are the plain formulas) imports them.
- No two modules of `seq2seq/` import each other, even through others or only for type hints.
- A live module's class is changed in one place, `seq2seq.mixins` (the speed kernels and an
  int8 export's GRU steps both go through it), so no module assigns `__class__` but that one.
- The benchmarks (`benchmarks/`, run as `python -m benchmarks.NAME`) use the library only:
  neither the Hydra apps of `seq2seq.cli` nor private names, and no `sys.path` edits.
- `configs/` at the top is the package's config tree (a symlink), which the wheel ships.
- `data/` holds a tracked README and nothing else that git would pick up.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "seq2seq"
BENCHMARKS = ROOT / "benchmarks"
LOWER_LAYERS = ("data", "models", "ops", "inference")


def module_name(path: Path) -> str:
    """`seq2seq/data/cache.py` -> `seq2seq.data.cache` (a package's `__init__` -> the package)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, *, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of everything a module's source imports, wherever the import stands.

    `from a.b import c` yields both `a.b` and `a.b.c` (c may be a submodule); relative imports
    are resolved against `module`; `importlib.import_module("x")` with a literal name counts too.
    """
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            yield node.lineno, base
            for alias in node.names:
                if alias.name != "*":
                    yield node.lineno, f"{base}.{alias.name}"
        elif isinstance(node, ast.Call) and called_name(node) == "import_module" and node.args:
            argument = node.args[0]
            if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                yield node.lineno, argument.value


def called_name(call: ast.Call) -> str | None:
    """`f` of `f(...)` or `x.f(...)`; None for other callees."""
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def is_within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == package or name.startswith(f"{package}.") for package in packages)


def forbidden_imports(files: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    """`path:line imports name` for every import of (a module inside) `forbidden`."""
    offences = []
    for path in files:
        is_package = path.name == "__init__.py"
        module = module_name(path) if path.is_relative_to(PACKAGE) else path.stem
        source = path.read_text("utf-8")
        for line, name in imported_modules(source, module=module, is_package=is_package):
            if is_within(name, forbidden):
                offences.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return sorted(set(offences))


def test_import_parser_sees_every_form():
    source = """
import seq2seq.training.trainer
from seq2seq import cli
from ..training import run
from . import beam
import importlib

def late():
    from seq2seq.training.distributed import is_main
    return importlib.import_module("seq2seq.cli.train")
"""
    names = {
        name for _, name in imported_modules(source, module="seq2seq.data.x", is_package=False)
    }
    assert {
        "seq2seq.training.trainer",
        "seq2seq.cli",
        "seq2seq.training.run",
        "seq2seq.data.beam",
        "seq2seq.training.distributed.is_main",
        "seq2seq.cli.train",
    } <= names
    package_names = {
        name for _, name in imported_modules(source, module="seq2seq.data", is_package=True)
    }
    assert "seq2seq.training.run" in package_names and "seq2seq.data.beam" in package_names


def test_lower_layers_import_neither_training_nor_cli():
    files = sorted(path for layer in LOWER_LAYERS for path in (PACKAGE / layer).rglob("*.py"))
    assert files, "no modules found: has the package moved?"
    offences = forbidden_imports(files, ("seq2seq.training", "seq2seq.cli"))
    assert not offences, "lower layers must not import training or cli:\n" + "\n".join(offences)


def test_models_and_export_import_no_speed_kernels():
    files = sorted(path for layer in ("models", "export")
                   for path in (PACKAGE / layer).rglob("*.py"))
    offences = forbidden_imports(files, ("seq2seq.ops",))
    assert not offences, "models/ and export/ must not import seq2seq.ops:\n" + "\n".join(offences)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules of ``graph`` (module -> modules it imports) that import each other,
    directly or through others (strongly connected components of more than one module)."""
    order: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(module: str) -> None:
        order[module] = lowest[module] = len(order)
        stack.append(module)
        for imported in sorted(graph[module]):
            if imported not in order:
                visit(imported)
                lowest[module] = min(lowest[module], lowest[imported])
            elif imported in stack:
                lowest[module] = min(lowest[module], order[imported])
        if lowest[module] == order[module]:
            group = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return cycles


def test_import_cycles_are_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(graph) == [["a", "b", "c"]]


def test_no_modules_import_each_other():
    paths = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
    graph = {
        module: {
            name
            for _, name in imported_modules(path.read_text("utf-8"), module=module,
                                            is_package=path.name == "__init__.py")
            if name in paths and name != module
        }
        for module, path in paths.items()
    }
    cycles = import_cycles(graph)
    assert not cycles, "modules that import each other:\n" + "\n".join(map(str, cycles))


def package_of(name: str) -> str | None:
    """The part of ``seq2seq`` a module belongs to: ``seq2seq.export.argos`` -> ``export``, a
    top-level module (``seq2seq.checkpoint``) -> itself; None for the package's ``__init__``."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "seq2seq" else None


def test_no_packages_import_each_other():
    # Modules may each be free of cycles while their packages form one (inference reading a
    # constant of export, export verifying with inference): the layers must stay a ladder.
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        own = package_of(module)
        if own is None:
            continue
        names = imported_modules(path.read_text("utf-8"), module=module,
                                 is_package=path.name == "__init__.py")
        graph.setdefault(own, set()).update(
            other for _, name in names
            if (other := package_of(name)) not in (None, own)
            and ((PACKAGE / other).is_dir() or (PACKAGE / f"{other}.py").is_file()))
    for imported in set().union(*graph.values()):
        graph.setdefault(imported, set())
    assert {"export", "inference", "cli"} <= set(graph)
    cycles = import_cycles(graph)
    assert not cycles, "packages that import each other:\n" + "\n".join(map(str, cycles))


def class_assignments(source: str) -> list[int]:
    """The lines of ``source`` that assign an object's ``__class__``."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Attribute) and target.attr == "__class__"]


def test_class_assignments_are_found():
    assert class_assignments("x = 1\nmodule.__class__ = Swapped\na.b.__class__: type = C\n") == [2, 3]


def test_only_seq2seq_mixins_changes_a_live_modules_class():
    offences = [f"{path.relative_to(ROOT)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
                if path != PACKAGE / "mixins.py"
                for line in class_assignments(path.read_text("utf-8"))]
    assert class_assignments((PACKAGE / "mixins.py").read_text("utf-8"))
    assert not offences, ("assign __class__ through seq2seq.mixins.mix_into:\n"
                          + "\n".join(offences))


def test_benchmarks_use_the_library_only():
    files = sorted(BENCHMARKS.rglob("*.py"))
    assert (BENCHMARKS / "__init__.py") in files and (BENCHMARKS / "bench.py") in files
    offences = forbidden_imports(files, ("seq2seq.cli",))
    for path in files:
        source = path.read_text("utf-8")
        module = f"benchmarks.{path.stem}"
        for line, name in imported_modules(source, module=module, is_package=False):
            private = [part for part in name.split(".") if part.startswith("_")
                       and not part.startswith("__")]
            if name.startswith("seq2seq.") and private:
                offences.append(f"{path.relative_to(ROOT)}:{line} imports private {name}")
        if "sys.path" in source:
            offences.append(f"{path.relative_to(ROOT)} edits sys.path")
    assert not offences, "benchmarks must use the library only:\n" + "\n".join(offences)


def test_top_level_configs_is_the_packages_config_tree():
    configs = ROOT / "configs"
    assert configs.is_symlink() and configs.resolve() == (PACKAGE / "configs").resolve()
    assert (configs / "train.yaml").is_file()


def git_ignores(path: str) -> bool:
    """Whether git would ignore `path` (which need not exist) in this checkout."""
    result = subprocess.run(
        ["git", "check-ignore", "--quiet", "--no-index", path], cwd=ROOT, check=False
    )
    assert result.returncode in (0, 1), f"git check-ignore failed on {path}"
    return result.returncode == 0


def test_data_folder_keeps_its_readme_and_ignores_the_rest():
    assert (ROOT / "data" / "README.md").is_file()
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    assert not git_ignores("data/README.md")
    for generated in ("data/cache/0123abcd/summary.json", "data/multi30k/train.de.gz"):
        assert git_ignores(generated), f"{generated} would be committed"
