#!/usr/bin/env bash
# Usage: scripts/study_transformer.sh [HYDRA_OVERRIDE...]
#        (or: sbatch scripts/study_transformer.sh, or: make study-transformer)
#
# The Transformer row of the attention study (docs/study.md): experiment=multi30k_transformer x
# STUDY_SEEDS, trained to the end of its cosine schedule, which ends at STUDY_TRANSFORMER_STEPS
# instead of after 59 minutes (no early stopping: it would stop while the learning rate is still
# high), STUDY_JOBS runs side by side on one core each, resumable like scripts/study.sh; then
# scripts/study_report.sh.
# Environment: STUDY_TRANSFORMER_STEPS (4000), STUDY_DIR (runs/attention_study), STUDY_SEEDS
# (1,2,3,4,5), STUDY_JOBS (2; with sbatch, -c the same), STUDY_RECORDS (docs/attention_study/runs),
# PYTHON, DRY_RUN=1 (print the commands instead of running them). Relative paths are from the
# repository root.
# STUDY_PRECISION (bf16, the precision seeds 1-5 trained in; fp32 runs form groups of their own).
#SBATCH --job-name=attention_study_transformer
#SBATCH --cpus-per-task=2
#SBATCH --time=08:00:00
set -euo pipefail

# scripts/common.sh finds the repository root (under sbatch, which runs a copy of this script,
# from the folder the job was submitted from) and goes there.
for c in "$(dirname "${BASH_SOURCE[0]}")" "${SLURM_SUBMIT_DIR:-.}"{/scripts,}; do [[ -f $c/common.sh ]] && break; done
[[ -f $c/common.sh ]] && source "$c/common.sh" || { echo "$0: cannot find the repository root; sbatch this script from it" >&2; exit 1; }
source scripts/study_common.sh

STUDY_TRANSFORMER_STEPS=${STUDY_TRANSFORMER_STEPS:-4000}

# The preset as seeds 1-5 trained it, before its retune for the hour (docs/results.md).
run "${study_sweep[@]}" experiment=multi30k_transformer \
    optimizer.lr=1.0e-3 batch.max_tokens=2400 model.encoder.ffn_dim=1024 model.decoder.ffn_dim=1024 \
    trainer.max_steps="$STUDY_TRANSFORMER_STEPS" trainer.early_stopping_patience=null \
    'hydra.sweep.subdir=transformer-seed${trainer.seed}' "$@"
scripts/study_report.sh
