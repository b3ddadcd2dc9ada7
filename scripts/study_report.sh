#!/usr/bin/env bash
# Usage: scripts/study_report.sh      (or: sbatch scripts/study_report.sh, or: make study-report)
#
# Scores the finished runs of STUDY_DIR on test_2016 into records in STUDY_RECORDS (each run once),
# then rebuilds the attention study's report in docs/attention_study from all the records
# (docs/study.md). scripts/study.sh and scripts/study_transformer.sh end with it.
# Environment: STUDY_DIR (runs/attention_study), STUDY_RECORDS (docs/attention_study/runs),
# PYTHON, DRY_RUN=1 (print the commands instead of running them). Relative paths are from the
# repository root.
#SBATCH --job-name=attention_study_report
#SBATCH --cpus-per-task=2
#SBATCH --time=02:00:00
set -euo pipefail

# scripts/common.sh finds the repository root (under sbatch, which runs a copy of this script,
# from the folder the job was submitted from) and goes there.
for c in "$(dirname "${BASH_SOURCE[0]}")" "${SLURM_SUBMIT_DIR:-.}"{/scripts,}; do [[ -f $c/common.sh ]] && break; done
[[ -f $c/common.sh ]] && source "$c/common.sh" || { echo "$0: cannot find the repository root; sbatch this script from it" >&2; exit 1; }
if (($#)); then echo "usage: $0 (no arguments; see the comment at its top)" >&2; exit 2; fi

STUDY_DIR=${STUDY_DIR:-runs/attention_study}
STUDY_RECORDS=${STUDY_RECORDS:-docs/attention_study/runs}

run "$PYTHON" compare.py "$STUDY_DIR" split=test records_dir="$STUDY_RECORDS" \
    plots=false test=none aso_iterations=0
run "$PYTHON" compare.py "$STUDY_RECORDS" split=test output_dir=docs/attention_study
