#!/usr/bin/env bash
# Usage: scripts/your_data_multi30k.sh [HYDRA_OVERRIDE...]      (or under sbatch)
#
# The fine-tuning and back-translation figures of docs/your-data.md, on Multi30k de-en split in two
# halves (A: the first 14,500 training pairs, B: the other 14,500), every model a
# multi30k_luong_fast:
#   baseline.seedS   trained on A for the 12-minute budget (also the fine-tuning parent)
#   scratch.seedS    trained from scratch on B for the 10-minute budget
#   finetune.seedS   baseline.seedS fine-tuned on B for the 10-minute budget (with the parent's
#                    vocabulary as measured: trainer.extend_vocab=false)
#   reverse          en -> de on A for the 12-minute budget
#   bt_beam.seedS, bt_sample.seedS   A + B's English back-translated by reverse (beam 5, or
#                    sampling), tagged "<bt>", for the 12-minute budget
# then every model scored on test_2016 (beam 5). Seeds 1 and 2.
#
# The budgets are step counts: what multi30k_luong_fast makes in 12 and 10 minutes on both cores of
# the AVX2 EPYC it was measured on (146 steps a minute: 1,760 and 1,465 steps), so that the
# results do not depend on how busy the machine is. The runs go two at a time, one core each, in
# two chains (about 95 minutes there); each step is skipped when done, so run it again after an
# interruption. Environment: YOUR_DATA_DIR (runs/your_data), MULTI30K (the folder of the Multi30k
# files: $SEQ2SEQ_MULTI30K_URL if it is a folder, else data/multi30k), STEPS_12, STEPS_10, PYTHON.
#SBATCH --job-name=your_data_multi30k
#SBATCH --cpus-per-task=2
#SBATCH --time=03:00:00
set -euo pipefail

for c in "$(dirname "${BASH_SOURCE[0]}")" "${SLURM_SUBMIT_DIR:-.}"{/scripts,}; do [[ -f $c/common.sh ]] && break; done
[[ -f $c/common.sh ]] && source "$c/common.sh" || { echo "$0: cannot find the repository root; sbatch this script from it" >&2; exit 1; }

dir=${YOUR_DATA_DIR:-runs/your_data}
if [[ -z ${MULTI30K:-} ]]; then
    if [[ -d ${SEQ2SEQ_MULTI30K_URL:-} ]]; then MULTI30K=$SEQ2SEQ_MULTI30K_URL; else MULTI30K=data/multi30k; fi
fi
[[ -f $MULTI30K/train.de.gz ]] || { echo "$0: no $MULTI30K/train.de.gz: set MULTI30K to the folder of the Multi30k files" >&2; exit 1; }
STEPS_12=${STEPS_12:-1760}
STEPS_10=${STEPS_10:-1465}

# The two halves, plain text.
mkdir -p "$dir/data"
for lang in de en; do
    [[ -f $dir/data/b.$lang ]] && continue
    gzip -dc "$MULTI30K/train.$lang.gz" > "$dir/data/all.$lang"
    head -n 14500 "$dir/data/all.$lang" > "$dir/data/a.$lang"
    tail -n +14501 "$dir/data/all.$lang" > "$dir/data/b.$lang.partial"
    mv "$dir/data/b.$lang.partial" "$dir/data/b.$lang"
    rm "$dir/data/all.$lang"
done

common=(trainer.num_threads=1 trainer.max_time=null data.src_lang=de data.tgt_lang=en
        data.valid.src="$MULTI30K/val.de.gz" data.valid.tgt="$MULTI30K/val.en.gz"
        data.test.src="$MULTI30K/test_2016_flickr.de.gz" data.test.tgt="$MULTI30K/test_2016_flickr.en.gz")

# train NAME OVERRIDE...: one run in $dir/NAME, skipped once done, continued if interrupted.
train() {
    local run_dir=$dir/$1
    shift
    if [[ -f $run_dir/DONE ]]; then echo "$run_dir: done already"; return; fi
    echo "$(date +%H:%M) training $run_dir"
    "$PYTHON" train.py experiment=multi30k_luong_fast hydra.run.dir="$run_dir" trainer.resume=auto \
        trainer.progress_bar=false "${common[@]}" "$@" > "$run_dir.log" 2>&1
    touch "$run_dir/DONE"
}

# Chain 1: the baselines (parents), then per seed the model from scratch on B and the fine-tuned one.
chain_finetune() {
    for seed in 1 2; do
        train "baseline.seed$seed" data=files data.train.src="$dir/data/a.de" data.train.tgt="$dir/data/a.en" \
            trainer.max_steps="$STEPS_12" trainer.seed="$seed" "$@"
    done
    for seed in 1 2; do
        train "scratch.seed$seed" data=files data.train.src="$dir/data/b.de" data.train.tgt="$dir/data/b.en" \
            trainer.max_steps="$STEPS_10" trainer.seed="$seed" "$@"
        train "finetune.seed$seed" data=files data.train.src="$dir/data/b.de" data.train.tgt="$dir/data/b.en" \
            trainer.init_from="$dir/baseline.seed$seed" trainer.extend_vocab=false \
            trainer.max_steps="$STEPS_10" trainer.seed="$seed" "$@"
    done
}

# Chain 2: the reverse model, both back-translations, the four forward models.
chain_backtranslate() {
    local mode seed
    for seed in 1 2; do
        for mode in beam sample; do
            PARALLEL_SRC=$dir/data/a.de PARALLEL_TGT=$dir/data/a.en MONO_TGT=$dir/data/b.en \
            VALID_SRC=$MULTI30K/val.de.gz VALID_TGT=$MULTI30K/val.en.gz SRC_LANG=de TGT_LANG=en \
            TEST_SRC=$MULTI30K/test_2016_flickr.de.gz TEST_TGT=$MULTI30K/test_2016_flickr.en.gz \
            BT_DIR=$dir BT_MODE=$mode BT_SEEDS=$seed BT_BASELINE=0 BT_THREADS=1 BT_SCORE=0 \
                scripts/backtranslate.sh trainer.max_time=null trainer.max_steps="$STEPS_12" "$@"
        done
    done
}

chain_finetune "$@" > "$dir/chain_finetune.log" 2>&1 &
chains=($!)
chain_backtranslate "$@" > "$dir/chain_backtranslate.log" 2>&1 &
chains+=($!)
trap 'kill "${chains[@]}" 2>/dev/null || true' INT TERM
echo "two chains running; follow them with: tail -f $dir/chain_*.log $dir/*.log"
failed=0
for pid in "${chains[@]}"; do wait "$pid" || failed=1; done
trap - INT TERM
((failed)) && { echo "a chain failed: see the end of $dir/chain_*.log" >&2; exit 1; }

# Every model on test_2016, beam 5, best first; and the minutes each took.
"$PYTHON" evaluate.py "checkpoint=$dir/*.seed*/checkpoints/best.pt" num_threads=2 | tee "$dir/test_2016.txt"
grep -H "done:" "$dir"/*/train.log | tee "$dir/steps.txt"
