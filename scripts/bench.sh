#!/usr/bin/env bash
# Usage: scripts/bench.sh [BENCH_OPTION...]          (or: sbatch scripts/bench.sh, or: make bench)
#
# The speed benchmark of docs/speed.md in one sitting: the CPU and its matmul ceiling, training
# fp32 against bf16 for the presets, decoding a checkpoint per precision, where the time goes;
# also written to bench/results.json. About 20 minutes on 2 cores; give the machine to it alone.
# The documented runs: `scripts/bench.sh` and
# `scripts/bench.sh --checkpoint runs/best_seed1/checkpoints/best.pt --profile-steps 0`
# (`python -m benchmarks.bench --help` lists the options).
# Environment: PYTHON, DRY_RUN=1 (print the command instead of running it), SEQ2SEQ_MULTI30K_URL
# (where to fetch Multi30k from, as for training).
#SBATCH --job-name=seq2seq_bench
#SBATCH --cpus-per-task=2
#SBATCH --time=01:30:00
set -euo pipefail

# scripts/common.sh finds the repository root (under sbatch, which runs a copy of this script,
# from the folder the job was submitted from) and goes there.
for c in "$(dirname "${BASH_SOURCE[0]}")" "${SLURM_SUBMIT_DIR:-.}"{/scripts,}; do [[ -f $c/common.sh ]] && break; done
[[ -f $c/common.sh ]] && source "$c/common.sh" || { echo "$0: cannot find the repository root; sbatch this script from it" >&2; exit 1; }

run "$PYTHON" -m benchmarks.bench "$@"
