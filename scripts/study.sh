#!/usr/bin/env bash
# Usage: scripts/study.sh [HYDRA_OVERRIDE...]     (or: sbatch scripts/study.sh, or: make study)
#
# The attention study's RNN grid (docs/study.md): every scorer of STUDY_SCORERS, then sparsemax on
# STUDY_SPARSEMAX, x STUDY_SEEDS, each run trained until validation BLEU stops improving (4
# validations in a row, 4,000 steps at most), STUDY_JOBS runs side by side on one core each; then
# scripts/study_report.sh. Run again (or after a time limit), it trains only the runs missing from
# STUDY_DIR (trainer.resume=auto in a folder per setting); a run kept only as a record in git is
# trained again, so give the seeds that are not recorded yet:
# `STUDY_SEEDS=3,4,5 scripts/study.sh`.
# Environment: STUDY_DIR (runs/attention_study), STUDY_SEEDS (1,2,3,4,5), STUDY_JOBS (2; with
# sbatch, -c the same), STUDY_SCORERS (gaussian,scaled_dot,additive,multihead,location,dot,general),
# STUDY_SPARSEMAX (scaled_dot), STUDY_RECORDS (docs/attention_study/runs), PYTHON, DRY_RUN=1
# (print the commands instead of running them). Relative paths are from the repository root.
# STUDY_PRECISION (bf16, the precision seeds 1-5 trained in; fp32 runs form groups of their own).
#SBATCH --job-name=attention_study
#SBATCH --cpus-per-task=2
#SBATCH --time=12:00:00
set -euo pipefail

# scripts/common.sh finds the repository root (under sbatch, which runs a copy of this script,
# from the folder the job was submitted from) and goes there.
for c in "$(dirname "${BASH_SOURCE[0]}")" "${SLURM_SUBMIT_DIR:-.}"{/scripts,}; do [[ -f $c/common.sh ]] && break; done
[[ -f $c/common.sh ]] && source "$c/common.sh" || { echo "$0: cannot find the repository root; sbatch this script from it" >&2; exit 1; }
source scripts/study_common.sh

STUDY_SCORERS=${STUDY_SCORERS:-gaussian,scaled_dot,additive,multihead,location,dot,general}
STUDY_SPARSEMAX=${STUDY_SPARSEMAX:-scaled_dot}

# The RNN grid (constant learning rate) stops at the 4th validation in a row without a better BLEU.
# A folder per setting, named scorer-normalizer-seedN.
subdir='${hydra:runtime.choices.model/attention}-${model.attention.normalizer}-seed${trainer.seed}'
study_train=("${study_sweep[@]}" experiment=multi30k_luong_fast trainer.max_steps=4000
    trainer.early_stopping_patience=4 "hydra.sweep.subdir=$subdir")
run "${study_train[@]}" model/attention="$STUDY_SCORERS" "$@"
run "${study_train[@]}" model/attention="$STUDY_SPARSEMAX" model.attention.normalizer=sparsemax "$@"
scripts/study_report.sh
