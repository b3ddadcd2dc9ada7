#!/usr/bin/env bash
# Usage: scripts/bench_opennmt.sh CHECKPOINT [BENCH_OPENNMT_OPTION...]
#        (or: sbatch scripts/bench_opennmt.sh CHECKPOINT)
#
# Decoding against OpenNMT-py 3.5.1 side by side (docs/speed.md): installs OpenNMT-py into
# ONMT_PATH beside this project's torch if it is not there yet, then runs benchmarks.bench_opennmt,
# which trains OpenNMT-py's like-for-like model on CHECKPOINT's pieces (or reuses one given with
# --onmt-model) and decodes test_2016 with both toolkits, greedy and beam 5.
# Example: `scripts/bench_opennmt.sh runs/best_seed1/checkpoints/best.pt --max-sentences 200`
# (`python -m benchmarks.bench_opennmt --help` lists the options).
# Environment: ONMT_PATH (/tmp/onmt), PYTHON, DRY_RUN=1 (print the commands instead of running
# them). Relative paths are from the repository root.
#SBATCH --job-name=seq2seq_bench_opennmt
#SBATCH --cpus-per-task=2
#SBATCH --time=01:30:00
set -euo pipefail

# scripts/common.sh finds the repository root (under sbatch, which runs a copy of this script,
# from the folder the job was submitted from) and goes there.
for c in "$(dirname "${BASH_SOURCE[0]}")" "${SLURM_SUBMIT_DIR:-.}"{/scripts,}; do [[ -f $c/common.sh ]] && break; done
[[ -f $c/common.sh ]] && source "$c/common.sh" || { echo "$0: cannot find the repository root; sbatch this script from it" >&2; exit 1; }
if (($# < 1)); then echo "usage: $0 CHECKPOINT [BENCH_OPENNMT_OPTION...]" >&2; exit 2; fi
checkpoint=$1
shift

ONMT_PATH=${ONMT_PATH:-/tmp/onmt}
# OpenNMT-py is not a dependency: installed without its dependencies, on this project's torch.
if [[ ! -d $ONMT_PATH/onmt ]]; then
    run "$PYTHON" -m pip install --no-deps --target "$ONMT_PATH" \
        opennmt-py==3.5.1 configargparse pyonmttok
fi
run "$PYTHON" -m benchmarks.bench_opennmt --checkpoint "$checkpoint" --onmt-path "$ONMT_PATH" "$@"
