#!/usr/bin/env bash
# Usage: scripts/best.sh [HYDRA_OVERRIDE...]      (or: sbatch scripts/best.sh, or: make best)
#
# The multi30k_best result (docs/results.md): two members trained side by side for the same 59
# minutes, one core each, then the beam settings of their ensemble chosen on val by
# seq2seq-tune-decoding; score the chosen setting on test once with the command it prints.
# By default both members are experiment=multi30k_best (seeds 1 and 2); BEST_EXPERIMENTS names
# another pair: two Transformers (scripts/best_transformer.sh) or a Transformer beside an RNN
# (`make best-mixed`). Every preset shares one tokenizer (8k joint BPE), which an ensemble needs.
# Each member logs to $BEST_DIR/NAME.log, NAME being seedN when both members are of one
# experiment, else EXPERIMENT_seedN (multi30k_ dropped): `tail -f runs/best/seed1.log`.
# Environment: BEST_DIR (runs/best), BEST_SEEDS ("1 2": the first two are used, one per member),
# BEST_EXPERIMENTS ("multi30k_best multi30k_best"), PYTHON, DRY_RUN=1 (print the commands instead
# of running them). Relative paths are from the repository root. Other seeds:
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
BEST_EXPERIMENTS=${BEST_EXPERIMENTS:-multi30k_best multi30k_best}
read -r seed_a seed_b _ <<< "$BEST_SEEDS"
if [[ -z ${seed_b:-} ]]; then
    echo "$0: BEST_SEEDS needs two seeds, got '$BEST_SEEDS'" >&2
    exit 1
fi
read -r experiment_a experiment_b extra <<< "$BEST_EXPERIMENTS"
if [[ -z ${experiment_b:-} || -n ${extra:-} ]]; then
    echo "$0: BEST_EXPERIMENTS needs two experiments (configs/experiment), got '$BEST_EXPERIMENTS'" >&2
    exit 1
fi
for experiment in "$experiment_a" "$experiment_b"; do
    if [[ ! -f configs/experiment/$experiment.yaml ]]; then
        echo "$0: BEST_EXPERIMENTS: no configs/experiment/$experiment.yaml" \
             "(one of: $(cd configs/experiment && ls *.yaml | sed 's/\.yaml$//' | tr '\n' ' '))" >&2
        exit 1
    fi
done
# A member's folder and log: seedN, or EXPERIMENT_seedN when the members' experiments differ.
member_name() {  # experiment seed
    if [[ $experiment_a == "$experiment_b" ]]; then echo "seed$2"; else echo "${1#multi30k_}_seed$2"; fi
}
name_a=$(member_name "$experiment_a" "$seed_a")
name_b=$(member_name "$experiment_b" "$seed_b")
if [[ $name_a == "$name_b" ]]; then
    echo "$0: both members would be $BEST_DIR/$name_a: give them two seeds" >&2
    exit 1
fi
log_a=$BEST_DIR/$name_a.log
log_b=$BEST_DIR/$name_b.log

run mkdir -p "$BEST_DIR"
if [[ $experiment_a == "$experiment_b" ]]; then
    say "training 2 members of $experiment_a side by side (62 minutes); logs: $log_a, $log_b"
else
    say "training $experiment_a and $experiment_b side by side (62 minutes); logs: $log_a, $log_b"
fi

# Each member in the background on one core, its output in its log.
members=()
for member in "$experiment_a $seed_a $name_a" "$experiment_b $seed_b $name_b"; do
    read -r experiment seed name <<< "$member"
    command=("$PYTHON" train.py experiment="$experiment" trainer.num_threads=1 trainer.seed="$seed"
             hydra.run.dir="$BEST_DIR/$name" "$@")
    if dry_run; then
        echo "$(quoted "${command[@]}") > $(quoted "$BEST_DIR/$name.log") 2>&1 &"
    else
        "${command[@]}" > "$BEST_DIR/$name.log" 2>&1 &
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
    echo "a member failed: see the end of $log_a and $name_b.log" >&2
    exit 1
fi

run "$PYTHON" -m seq2seq.cli.tune_decoding \
    "checkpoint=[$BEST_DIR/$name_a/checkpoints/best.pt,$BEST_DIR/$name_b/checkpoints/best.pt]" \
    "beam_sizes=[1,5,8]" "length_penalties=[1.0,1.4]"
