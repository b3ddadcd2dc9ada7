#!/usr/bin/env bash
# Usage: scripts/best.sh [HYDRA_OVERRIDE...]      (or: sbatch scripts/best.sh, or: make best)
#
# The multi30k_best result (docs/results.md): two seeds of experiment=multi30k_best trained side by
# side for the same 59 minutes, one core each, then the beam settings of their ensemble chosen on
# val by seq2seq-tune-decoding; score the chosen setting on test once with the command it prints.
# Each member logs to $BEST_DIR/seedN.log (follow one with `tail -f runs/best/seed1.log`).
# Environment: BEST_DIR (runs/best), BEST_SEEDS ("1 2": the first two are used), PYTHON,
# DRY_RUN=1 (print the commands instead of running them). Relative paths are from the repository
# root. Other seeds:
# `BEST_SEEDS="3 4" BEST_DIR=runs/best34 scripts/best.sh`.
#SBATCH --job-name=multi30k_best
#SBATCH --cpus-per-task=2
#SBATCH --time=01:30:00
set -euo pipefail

# scripts/common.sh finds the repository root (under sbatch, which runs a copy of this script,
# from the folder the job was submitted from) and goes there.
for c in "$(dirname "${BASH_SOURCE[0]}")" "${SLURM_SUBMIT_DIR:-.}"{/scripts,}; do [[ -f $c/common.sh ]] && break; done
[[ -f $c/common.sh ]] && source "$c/common.sh" || { echo "$0: cannot find the repository root; sbatch this script from it" >&2; exit 1; }

BEST_DIR=${BEST_DIR:-runs/best}
BEST_SEEDS=${BEST_SEEDS:-1 2}
read -r seed_a seed_b _ <<< "$BEST_SEEDS"
if [[ -z ${seed_b:-} ]]; then
    echo "$0: BEST_SEEDS needs two seeds, got '$BEST_SEEDS'" >&2
    exit 1
fi
log_a=$BEST_DIR/seed$seed_a.log
log_b=$BEST_DIR/seed$seed_b.log

run mkdir -p "$BEST_DIR"
say "training 2 members of multi30k_best side by side (62 minutes); logs: $log_a, $log_b"

# Each member in the background on one core, its output in its log.
members=()
for seed in "$seed_a" "$seed_b"; do
    member=("$PYTHON" train.py experiment=multi30k_best trainer.num_threads=1 trainer.seed="$seed"
            hydra.run.dir="$BEST_DIR/seed$seed" "$@")
    if dry_run; then
        echo "$(quoted "${member[@]}") > $(quoted "$BEST_DIR/seed$seed.log") 2>&1 &"
    else
        "${member[@]}" > "$BEST_DIR/seed$seed.log" 2>&1 &
        members+=($!)
    fi
done
# Interrupted (Ctrl-C, scancel), stop both; either failing fails the whole.
trap 'kill "${members[@]}" 2>/dev/null || true' INT TERM
failed=0
for pid in ${members[@]+"${members[@]}"}; do wait "$pid" || failed=1; done
trap - INT TERM
if dry_run; then echo wait; fi
if ((failed)); then
    echo "a member failed: see the end of $log_a and seed$seed_b.log" >&2
    exit 1
fi

run "$PYTHON" -m seq2seq.cli.tune_decoding "$BEST_DIR/seed$seed_a/checkpoints/best.pt" \
    "$BEST_DIR/seed$seed_b/checkpoints/best.pt" --beam-sizes 1,5,8 --length-penalties 1.0,1.4
