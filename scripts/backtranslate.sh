#!/usr/bin/env bash
# Usage: [VAR=value ...] scripts/backtranslate.sh [HYDRA_OVERRIDE...]      (or under sbatch)
#
# Back-translation (docs/your-data.md): train a reverse model (target -> source) on the parallel
# pairs, translate monolingual target text with it (by sampling or by beam search), add those
# synthetic pairs as a second, tagged corpus, train the forward model on both, and score it beside
# a baseline trained on the parallel pairs alone. The overrides go to every train.py call (a
# budget, the thread count, ...).
#
# Environment:
#   PARALLEL_SRC, PARALLEL_TGT   the parallel training pairs (required)
#   MONO_TGT                     monolingual target-language text to back-translate (required)
#   VALID_SRC, VALID_TGT         validation pairs (required)
#   TEST_SRC, TEST_TGT           test pairs scored at the end (optional)
#   SRC_LANG, TGT_LANG           names of the two sides (src, tgt)
#   BT_DIR                       where everything goes (runs/backtranslation)
#   BT_MODE                      sample (default: unrestricted sampling, Edunov et al. 2018) | beam
#   BT_SEEDS                     seeds of the forward models ("1")
#   BT_BASELINE                  1 (default): also train the parallel-only baseline per seed; 0: not
#   BT_TAG                       the tag prepended to synthetic sources ("<bt>"; empty: no tag)
#   BT_EXPERIMENT                the preset every model starts from (multi30k_luong_fast)
#   BT_THREADS                   CPU threads of every step (empty: all cores)
#   BT_SCORE                     1 (default): score every forward model of BT_DIR on the test pairs
#   PYTHON, DRY_RUN=1 (print the commands instead of running them)
# Every step is skipped when its result exists (a run folder holding DONE, a synthetic file), and
# an interrupted training run continues (trainer.resume=auto): run it again to go on.
#SBATCH --job-name=backtranslate
#SBATCH --cpus-per-task=2
#SBATCH --time=03:00:00
set -euo pipefail

for c in "$(dirname "${BASH_SOURCE[0]}")" "${SLURM_SUBMIT_DIR:-.}"{/scripts,}; do [[ -f $c/common.sh ]] && break; done
[[ -f $c/common.sh ]] && source "$c/common.sh" || { echo "$0: cannot find the repository root; sbatch this script from it" >&2; exit 1; }

for var in PARALLEL_SRC PARALLEL_TGT MONO_TGT VALID_SRC VALID_TGT; do
    [[ -n ${!var:-} ]] || { echo "$0: set $var (see the usage at the top of $0)" >&2; exit 1; }
done
BT_DIR=${BT_DIR:-runs/backtranslation}
BT_MODE=${BT_MODE:-sample}
BT_SEEDS=${BT_SEEDS:-1}
BT_BASELINE=${BT_BASELINE:-1}
BT_TAG=${BT_TAG-<bt>}
BT_EXPERIMENT=${BT_EXPERIMENT:-multi30k_luong_fast}
SRC_LANG=${SRC_LANG:-src}
TGT_LANG=${TGT_LANG:-tgt}
case $BT_MODE in
    sample) search=(search=sample seed=1) ;;
    beam) search=(search=beam beam_size=5) ;;
    *) echo "$0: BT_MODE must be sample or beam, got '$BT_MODE'" >&2; exit 1 ;;
esac
threads=()
if [[ -n ${BT_THREADS:-} ]]; then threads=(num_threads="$BT_THREADS"); fi
valid=(data.valid.src="$VALID_SRC" data.valid.tgt="$VALID_TGT")
test_split=()
if [[ -n ${TEST_SRC:-} ]]; then test_split=(data.test.src="$TEST_SRC" data.test.tgt="$TEST_TGT"); fi

# train NAME OVERRIDE...: one train.py run in $BT_DIR/NAME, skipped once it has finished.
train() {
    local dir=$BT_DIR/$1
    shift
    if [[ -f $dir/DONE ]]; then say "$dir: done already"; return; fi
    say "training $dir (log: $dir/train.log)"
    run "$PYTHON" train.py experiment="$BT_EXPERIMENT" hydra.run.dir="$dir" trainer.resume=auto \
        trainer.progress_bar=false ${threads[@]+"trainer.${threads[0]}"} "$@"
    run touch "$dir/DONE"
}

run mkdir -p "$BT_DIR"

# 1. The reverse model: target -> source, on the parallel pairs.
train reverse data=files data.src_lang="$TGT_LANG" data.tgt_lang="$SRC_LANG" \
    data.train.src="$PARALLEL_TGT" data.train.tgt="$PARALLEL_SRC" \
    data.valid.src="$VALID_TGT" data.valid.tgt="$VALID_SRC" trainer.seed=1 "$@"

# 2. Synthetic sources: the monolingual text translated back, line for line (written whole or not at all).
synthetic=$BT_DIR/synthetic.$BT_MODE.$SRC_LANG
if [[ -f $synthetic ]]; then
    say "$synthetic: done already"
else
    say "back-translating $MONO_TGT by $BT_MODE into $synthetic"
    run "$PYTHON" translate.py checkpoint="$BT_DIR/reverse/checkpoints/best.pt" \
        input="$MONO_TGT" output="$synthetic.partial" "${search[@]}" ${threads[@]+"${threads[@]}"}
    run mv "$synthetic.partial" "$synthetic"
fi

# 3. The forward models: parallel pairs plus the synthetic pairs (tagged), and the baseline.
tag=()
if [[ -n $BT_TAG ]]; then tag=(", tag: \"$BT_TAG\""); fi
corpora="[{src: $PARALLEL_SRC, tgt: $PARALLEL_TGT, name: parallel}, {src: $synthetic, tgt: $MONO_TGT, name: bt_$BT_MODE${tag[*]}}]"
for seed in $BT_SEEDS; do
    if [[ $BT_BASELINE != 0 ]]; then
        train "baseline.seed$seed" data=files data.src_lang="$SRC_LANG" data.tgt_lang="$TGT_LANG" \
            data.train.src="$PARALLEL_SRC" data.train.tgt="$PARALLEL_TGT" "${valid[@]}" \
            ${test_split[@]+"${test_split[@]}"} trainer.seed="$seed" "$@"
    fi
    train "bt_$BT_MODE.seed$seed" data=corpora data.src_lang="$SRC_LANG" data.tgt_lang="$TGT_LANG" \
        "data.train=$corpora" "${valid[@]}" ${test_split[@]+"${test_split[@]}"} trainer.seed="$seed" "$@"
done

# 4. Compare: every forward model of $BT_DIR on the test split, best first.
if [[ -n ${TEST_SRC:-} && ${BT_SCORE:-1} != 0 ]]; then
    run "$PYTHON" evaluate.py "checkpoint=$BT_DIR/*.seed*/checkpoints/best.pt"
fi
