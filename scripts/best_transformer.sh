#!/usr/bin/env bash
# Usage: scripts/best_transformer.sh [HYDRA_OVERRIDE...]   (or: make best-transformer)
#
# scripts/best.sh with two experiment=multi30k_transformer members (seeds 1 and 2) side by side
# for 59 minutes, one core each, then their ensemble's beam settings chosen on val
# (docs/results.md). Environment: BEST_DIR (runs/best_transformer), BEST_SEEDS, PYTHON, DRY_RUN,
# as scripts/best.sh says. A Transformer beside an RNN: `make best-mixed`.
#SBATCH --job-name=best_transformer
#SBATCH --cpus-per-task=2
#SBATCH --time=01:30:00
set -euo pipefail

# Under sbatch this script is a copy: best.sh is found as scripts/common.sh finds the root.
for c in "$(dirname "${BASH_SOURCE[0]}")" "${SLURM_SUBMIT_DIR:-.}"{/scripts,}; do [[ -f $c/best.sh ]] && break; done
[[ -f $c/best.sh ]] || { echo "$0: cannot find scripts/best.sh; sbatch this script from the repository root" >&2; exit 1; }
BEST_DIR=${BEST_DIR:-runs/best_transformer} \
BEST_EXPERIMENTS="multi30k_transformer multi30k_transformer" exec bash "$c/best.sh" "$@"
