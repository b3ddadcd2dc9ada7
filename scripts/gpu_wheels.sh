#!/usr/bin/env bash
# Usage: scripts/gpu_wheels.sh              (or: make gpu-wheels)
#
# Downloads, here where the package registry is reachable, the wheels that scripts/gpu_check.sh
# installs (pip --no-index, no network) on a GPU machine whose PyTorch image lacks them:
# hydra-core, omegaconf and antlr4-python3-runtime (the image has none of them), sentencepiece
# and sacrebleu (it has its own; these are fallbacks), each without its dependencies (the image
# has them: packaging, PyYAML, numpy, regex, ...), at the versions installed here, for CPython
# $GPU_PYTHON_VERSION on x86-64 Linux. About 2 MB, into $GPU_WHEELS (wheels/, ignored by git).
# antlr4-python3-runtime 4.9.3 (what omegaconf 2.3 needs) is published as source only: it is
# built into a pure-Python wheel here.
# Environment: GPU_WHEELS (wheels), GPU_PYTHON_VERSION (3.12: the GPU image's Python),
# GPU_WHEEL_PACKAGES (the list above), PYTHON (the interpreter whose versions are pinned and
# whose pip downloads). Relative paths are from the repository root.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || exit 1

GPU_WHEELS=${GPU_WHEELS:-wheels}
GPU_PYTHON_VERSION=${GPU_PYTHON_VERSION:-3.12}
GPU_WHEEL_PACKAGES=${GPU_WHEEL_PACKAGES:-hydra-core omegaconf antlr4-python3-runtime sentencepiece sacrebleu}
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64
           manylinux1_x86_64)

mkdir -p "$GPU_WHEELS"
for package in $GPU_WHEEL_PACKAGES; do
    # The version installed here (the one the tests pass with), else the newest.
    version=$("$PYTHON" -c "import importlib.metadata as m, sys
try:
    print(m.version(sys.argv[1]))
except m.PackageNotFoundError:
    pass" "$package")
    requirement=$package${version:+==$version}
    stem=$(tr '[:upper:]-' '[:lower:]_' <<<"$package")
    # One version of each: two would stop the install there.
    rm -f "$GPU_WHEELS/$stem"-*.whl
    platforms=()
    for platform in "${PLATFORMS[@]}"; do platforms+=(--platform "$platform"); done
    if ! "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
            --python-version "$GPU_PYTHON_VERSION" --implementation cp "${platforms[@]}" \
            -d "$GPU_WHEELS" "$requirement"; then
        echo "no wheel of $requirement for CPython $GPU_PYTHON_VERSION on x86-64 Linux;" \
             "building a pure-Python one"
        "$PYTHON" -m pip wheel --quiet --no-deps --no-binary=:all: -w "$GPU_WHEELS" "$requirement"
        if ! compgen -G "$GPU_WHEELS/$stem-*-none-any.whl" >/dev/null; then
            echo "$0: $requirement did not build into a pure-Python wheel (py3-none-any)" >&2
            exit 1
        fi
    fi
done
echo "wheels for scripts/gpu_check.sh in $GPU_WHEELS ($(du -sh "$GPU_WHEELS" | cut -f1)):"
ls -1 "$GPU_WHEELS"
echo "carry this folder (and data/multi30k) to the GPU machine; docs/results.md#gpu-check"
