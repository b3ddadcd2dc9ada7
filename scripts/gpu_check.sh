#!/usr/bin/env bash
# Usage: scripts/gpu_check.sh [--dry-run]            (or: make gpu-check [ARGS=--dry-run])
#
# The GPU check (docs/results.md#gpu-check): at most 14 minutes on one CUDA GPU, no network.
#   0 setup     what the GPU machine's PyTorch image lacks (hydra-core, omegaconf, antlr4 ...)
#               installed from the wheels of $GPU_WHEELS (made by scripts/gpu_wheels.sh) with
#               pip --no-index, only where an import fails; the GPU, torch and CUDA named
#   1 tests     the tests that use CUDA (tests/test_gpu_check.py -k cuda)
#   2 train     experiment=multi30k_transformer_gpu (bf16, 6,400-token batches) for 3 minutes:
#               target tokens/s, their share of the GPU's bf16 matrix ceiling (measured in the
#               same step), and validation BLEU (greedy) against minutes of training; then the
#               CPU preset (experiment=multi30k_transformer) for 3 minutes on the same GPU, its
#               curve, and whether the GPU preset's lies above it at every whole minute
#   3 beam      evaluate.py split=valid beam_size=5 on its best.pt: sentences/s and BLEU
#   4 torchrun  torchrun --nproc_per_node=1 for 48 steps in an NCCL process group with
#               DistributedDataParallel (train.py joins a group only for WORLD_SIZE > 1, so the
#               check makes its one rank join one: the NCCL and DDP paths do run)
#   5 resume    30 steps, then trainer.resume=auto to 60: it must continue from step 30
# Each step prints a header and a "RESULT [k/5] ..." line; the check ends with a table (step,
# result, seconds) that it also writes to $GPU_CHECK_DIR/summary.md, ready for docs/results.md.
# It exits 1 if a step failed.
#
# --dry-run: the same steps on the CPU in about a minute, for CI (tests/test_gpu_check.py): a tiny
# Transformer over 600 pairs of the Multi30k files, a few steps each, fp32, gloo instead of NCCL
# (the CUDA tests skip). Not the other scripts' DRY_RUN=1 (print the commands): it runs them.
#
# Needs: the Multi30k de/en files in data/multi30k (train, val, test_2016_flickr; a run of
# `python -m seq2seq.cli.prepare_data` fetches them) or SEQ2SEQ_MULTI30K_URL naming a mirror
# folder; on the GPU machine also the wheels. On the device machine of this workplace:
# `scripts/gpu_wheels.sh` here, then a run of `scripts/gpu_check.sh` there that carries
# wheels and data/multi30k (the exact command is in docs/results.md#gpu-check).
#
# Environment: GPU_CHECK_DIR (outputs: the transcript, the summary, one log per step; default
# $OUT if set, else runs/gpu_check), GPU_CHECK_WORK (run folders, checkpoints; default
# $GPU_CHECK_DIR/work, or /tmp/seq2seq_gpu_check when $OUT is set, so that only the logs come
# back), GPU_WHEELS (wheels), GPU_CHECK_BUDGET (seconds for the whole check: 840, dry run 300),
# GPU_CHECK_VALID_EVERY (steps between the training run's validations: the preset's 300 unless
# set), GPU_CHECK_STEPS (the steps to run, e.g. '1 5' to rerun the tests
# and the resume after a fix: all five; step 3 decodes step 2's checkpoint), PYTHON.
# Relative paths are from the repository root.
set -uo pipefail

MODE=gpu
for arg in "$@"; do
    case $arg in
        --dry-run) MODE=dry ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "$0: unknown argument '$arg' (--dry-run or --help)" >&2; exit 2 ;;
    esac
done

source "$(dirname "${BASH_SOURCE[0]}")/common.sh" || exit 1
# common.sh falls back to `python`; the GPU machine's image has python3 only.
command -v "$PYTHON" >/dev/null || PYTHON=python3
if dry_run; then
    echo "$0: DRY_RUN=1 (print the commands) does not apply here; --dry-run runs the check" \
         "on the CPU in about a minute" >&2
    exit 2
fi

OUT_DIR=${GPU_CHECK_DIR:-${OUT:-runs/gpu_check}}
if [[ -n ${GPU_CHECK_WORK:-} ]]; then WORK=$GPU_CHECK_WORK
elif [[ -z ${GPU_CHECK_DIR:-} && -n ${OUT:-} ]]; then WORK=${TMPDIR:-/tmp}/seq2seq_gpu_check
else WORK=$OUT_DIR/work
fi
GPU_WHEELS=${GPU_WHEELS:-wheels}
if [[ $MODE == dry ]]; then BUDGET=${GPU_CHECK_BUDGET:-300}; else BUDGET=${GPU_CHECK_BUDGET:-840}; fi
VALID_EVERY=${GPU_CHECK_VALID_EVERY:-}
STEPS=${GPU_CHECK_STEPS:-1 2 3 4 5}
if [[ ! $STEPS =~ ^[1-5]( [1-5])*$ ]]; then
    echo "$0: GPU_CHECK_STEPS='$STEPS': expected step numbers 1-5 separated by spaces, e.g. '1 5'" >&2
    exit 2
fi
mkdir -p "$OUT_DIR" "$WORK" || exit 1
OUT_DIR=$(cd "$OUT_DIR" && pwd) && WORK=$(cd "$WORK" && pwd) || exit 1
# The run folders of this check only: a rerun starts them over.
rm -rf "$WORK/train" "$WORK/train_cpu_preset" "$WORK/ddp" "$WORK/resume" "$WORK/slice" "$WORK/site" "$WORK/data"
rm -f "$OUT_DIR"/[0-5]_*.log "$OUT_DIR/summary.md"
exec > >(tee "$OUT_DIR/gpu_check.log") 2>&1

export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
# The repository on the import path: on the GPU machine seq2seq is not installed, and the
# torchrun step runs a program from $WORK.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
START=$(date +%s)
ROWS=()
FAILED=0

now() { date +%s.%N; }
seconds_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
# Seconds left of the budget less $2 (kept for the steps after), at most $1.
allowed() {
    local left=$((BUDGET - ($(date +%s) - START) - ${2:-0}))
    ((left < $1)) && echo "$left" || echo "$1"
}
header() { echo; echo "==== [$1/5] $2 ===="; }
# Records a step's result: its line, its row of the summary.
result() {  # number name status text started
    local seconds
    seconds=$(seconds_since "$5")
    echo "RESULT [$1/5] $2: $3: $4 (${seconds} s)"
    ROWS+=("| $1 $2 | $3: $4 | $seconds |")
    [[ $3 == ok ]] || FAILED=1
}
# Runs a command under a time limit, its output into a log; prints the command first.
# Returns the command's status (124: out of time).
limited() {  # seconds log command...
    local seconds=$1 log=$2
    shift 2
    echo "\$ $(quoted "$@")   # $seconds s at most; output: $log"
    if ((seconds < 5)); then
        echo "(out of budget)" >>"$log"
        return 124
    fi
    timeout -k 15 "$seconds" "$@" >>"$log" 2>&1
}
# A failed command's status in words, and the end of its log.
failure() {  # status log
    if (($1 == 124 || $1 == 137)); then echo "timed out"; else echo "exit status $1"; fi
    echo "--- the end of $2:" >&2
    tail -n 25 "$2" >&2
}
# 1234567 as 1,234,567.
thousands() { sed -E ':a; s/([0-9])([0-9]{3})($|,)/\1,\2\3/; ta' <<<"$1"; }
# The last value a regular expression's first group matched in a file ('' if none).
last_match() {  # regex file (the regex without '#')
    sed -nE "s#.*$1.*#\\1#p" "$2" | tail -n 1
}

# -- the run settings ------------------------------------------------------------------------
MULTI30K=${SEQ2SEQ_MULTI30K_URL:-}
MULTI30K=${MULTI30K#file://}
have_multi30k() {
    local split lang
    for split in train val test_2016_flickr; do
        for lang in de en; do [[ -f $1/$split.$lang.gz ]] || return 1; done
    done
}
if [[ $MODE == dry ]]; then
    DEVICE=cpu; PRECISION=fp32; BACKEND=gloo
    STEPS_DDP=8; STEPS_RESUME=4
    # Tiny Transformers of the presets' kind over 600 pairs, one thread.
    RUN=(trainer.device=cpu trainer.num_threads=1
         trainer.progress_bar=false data=files
         "data.train.src=$WORK/slice/train.de" "data.train.tgt=$WORK/slice/train.en"
         "data.valid.src=$WORK/slice/val.de" "data.valid.tgt=$WORK/slice/val.en"
         "paths.data_dir=$WORK/data" tokenizer.vocab_size=400
         model.embed_dim=32 model.encoder.num_layers=1 model.decoder.num_layers=1
         model.encoder.num_heads=2 model.decoder.num_heads=2
         model.encoder.ffn_dim=64 model.decoder.ffn_dim=64
         batch.max_tokens=600 scheduler.warmup_steps=4 trainer.valid.attention_plot_index=-1
         trainer.log_every=2)
    EVALUATE=(num_threads=1)
    TRAIN=(experiment=multi30k_transformer_gpu trainer.precision=fp32 trainer.max_time=null
           trainer.max_steps=12 trainer.valid_every=6 trainer.save_every=6 trainer.average_last=2
           trainer.log_every=2 trainer.valid.max_tokens=600)
    # The CPU preset with the same overrides (TRAIN's first entry names the GPU preset).
    TRAIN_CPU_PRESET=(experiment=multi30k_transformer "${TRAIN[@]:1}" trainer.valid_each_epoch=false)
else
    DEVICE=cuda; PRECISION=bf16; BACKEND=nccl
    STEPS_DDP=48; STEPS_RESUME=30
    RUN=(trainer.device=cuda trainer.progress_bar=false)
    EVALUATE=()
    TRAIN=(experiment=multi30k_transformer_gpu trainer.precision=bf16 trainer.max_time=3
           ${VALID_EVERY:+"trainer.valid_every=$VALID_EVERY" "trainer.save_every=$VALID_EVERY"})
    # The CPU preset as it is, but for the device, its 3 minutes and the GPU preset's
    # validations (not also at each epoch's end: the best of more validations would be favoured).
    TRAIN_CPU_PRESET=(experiment=multi30k_transformer trainer.precision=bf16 trainer.max_time=3
                      "trainer.valid_every=${VALID_EVERY:-300}" "trainer.save_every=${VALID_EVERY:-300}"
                      trainer.valid_each_epoch=false)
fi

echo "GPU check ($MODE run), $(date -u '+%Y-%m-%d %H:%M UTC'); outputs: $OUT_DIR; run folders: $WORK;" \
     "budget ${BUDGET} s"

# -- 0: setup --------------------------------------------------------------------------------
echo; echo "==== [0/5] setup: packages, data, device ===="
started=$(now)
log=$OUT_DIR/0_setup.log
: >"$log"
# One interpreter says what is missing or, where nothing is, names the device and the versions
# (on the CPU without importing torch: the dry run is a matter of seconds).
describe() {
    "$PYTHON" - "$MODE" 2>>"$log" <<'EOF'
import importlib.metadata
import importlib.util
import sys

modules = ("torch hydra omegaconf antlr4 sentencepiece sacrebleu yaml numpy tqdm matplotlib "
           "tensorboard pytest").split()
missing = [name for name in modules if importlib.util.find_spec(name) is None]
if missing:
    print("missing:", *missing)
    sys.exit(3)
if sys.argv[1] == "gpu":
    import torch

    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU visible to torch (scripts/gpu_check.sh --dry-run runs on the CPU)")
    props = torch.cuda.get_device_properties(0)
    where = (f"{props.name} ({props.total_memory / 2**30:.0f} GiB, capability "
             f"{props.major}.{props.minor}), CUDA {torch.version.cuda}")
else:
    where = "CPU (dry run)"
versions = ", ".join(f"{name} {importlib.metadata.version(name)}" for name in (
    "torch", "hydra-core", "omegaconf", "sentencepiece", "sacrebleu"))
print(f"{where}, Python {sys.version.split()[0]}, {versions}")
EOF
}
setup_status=ok; setup_note=""
described=$(describe)
status=$?
if ((status == 3)); then
    echo "$described here"
    if compgen -G "$GPU_WHEELS/*.whl" >/dev/null; then
        limited "$(allowed 120)" "$log" "$PYTHON" -m pip install -q --no-index --no-deps \
            --no-compile --no-cache-dir --upgrade --target "$WORK/site" \
            --find-links "$GPU_WHEELS" "$GPU_WHEELS"/*.whl
        export PYTHONPATH="$PYTHONPATH:$WORK/site"
        setup_note="installed from $GPU_WHEELS: $(cd "$GPU_WHEELS" && echo *.whl); "
        described=$(describe)
        status=$?
    fi
fi
if ((status == 0)); then
    setup_note+=$described
else
    setup_status=FAILED
    setup_note+=${described:-$(tail -n 1 "$log")}
    ((status == 3)) && setup_note+=" (make the wheels with scripts/gpu_wheels.sh and carry $GPU_WHEELS)"
fi
if [[ $setup_status == ok ]]; then
    if [[ $MODE == dry ]]; then
        source_dir=""
        for candidate in "$MULTI30K" data/multi30k; do
            if [[ -n $candidate ]] && have_multi30k "$candidate"; then source_dir=$candidate; break; fi
        done
        if [[ -z $source_dir ]]; then
            setup_status=FAILED
            setup_note+="; no Multi30k files (SEQ2SEQ_MULTI30K_URL, a folder, or data/multi30k)"
        else
            # The first 600 training and 40 validation pairs.
            mkdir -p "$WORK/slice"
            for lang in de en; do
                gzip -cd "$source_dir/train.$lang.gz" | awk 'NR <= 600' >"$WORK/slice/train.$lang"
                gzip -cd "$source_dir/val.$lang.gz" | awk 'NR <= 40' >"$WORK/slice/val.$lang"
            done
            setup_note+="; data: 600 training and 40 validation pairs of $source_dir"
        fi
    elif have_multi30k data/multi30k; then
        setup_note+="; data: data/multi30k"
    elif [[ -n $MULTI30K ]]; then
        setup_note+="; data: fetched from $MULTI30K"
    else
        setup_status=FAILED
        setup_note+="; no Multi30k files: carry data/multi30k or set SEQ2SEQ_MULTI30K_URL"
    fi
fi
echo "RESULT [0/5] setup: $setup_status: $setup_note"
ROWS+=("| 0 setup | $setup_status: $setup_note | $(seconds_since "$started") |")
if [[ $setup_status != ok ]]; then
    FAILED=1
    tail -n 25 "$log" >&2
fi

# -- 1: the tests that use CUDA --------------------------------------------------------------
step_tests() {
    header 1 "the tests that use CUDA"
    local started log=$OUT_DIR/1_tests.log status summary
    started=$(now)
    # A plain session, also when this script runs inside a pytest-xdist worker.
    limited "$(allowed 100)" "$log" env -u PYTEST_XDIST_WORKER -u PYTEST_XDIST_TESTRUNUID \
        -u PYTEST_ADDOPTS "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_gpu_check.py -k cuda
    status=$?
    summary=$(grep -E '^=*.*[0-9]+ (passed|failed|skipped|error)' "$log" | tail -n 1 | tr -d '=' \
              | sed -E 's/ in [0-9.]+s//; s/^ +| +$//g')
    if ((status != 0)); then
        result 1 tests FAILED "$(failure $status "$log"); ${summary:-no summary}" "$started"
    elif [[ $MODE == gpu && $summary != *passed* ]]; then
        result 1 tests FAILED "nothing ran on the GPU: $summary" "$started"
    else
        result 1 tests ok "$summary$([[ $MODE == dry ]] && echo ' (no CUDA: they skip)')" "$started"
    fi
}

# The bf16 matrix-product ceiling of the GPU in TFLOP/s: the mean of ten 8192^3 products after
# three warm-ups (the share of it a training run reaches says how launch-bound it is).
matmul_ceiling() {
    "$PYTHON" - <<'EOF_CEILING'
import torch

a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
for _ in range(3):
    a @ b
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(10):
    a @ b
end.record()
torch.cuda.synchronize()
print(f"{10 * 2 * 8192**3 / (start.elapsed_time(end) / 1000) / 1e12:.0f}")
EOF_CEILING
}

# -- 2: the 3-minute multi30k_transformer_gpu, then the CPU preset on the same GPU ------------
# Trains one preset into $WORK/$1 and sets: run_log, tok (median target tok/s of the log lines
# after the first), best, averaged, parameters, curve ("BLEU@minutes" of each validation); on a
# failure, problem (what went wrong) and status 1.
train_preset() {  # folder log seconds overrides...
    local folder=$1 log=$2 seconds=$3
    shift 3
    limited "$seconds" "$log" "$PYTHON" train.py "${RUN[@]}" "$@" "hydra.run.dir=$WORK/$folder"
    local status=$?
    run_log=$WORK/$folder/train.log
    if ((status != 0)) || [[ ! -f $run_log ]]; then
        problem=$(failure $status "$log")
        return 1
    fi
    tok=$(sed -nE 's/.*step [0-9]+ epoch [0-9]+: .* ([0-9]+) tok\/s.*/\1/p' "$run_log" | tail -n +2 \
          | sort -n | awk '{ v[NR] = $1 } END { if (NR) printf "%d", v[int((NR + 1) / 2)] }')
    best=$(sed -nE 's/.*done: ([0-9]+) steps, ([0-9]+) epochs .* ([0-9.]+) min training, best BLEU ([0-9.]+) at step ([0-9]+).*/\4 at step \5 (\1 steps in \3 min, \2 epochs)/p' \
           "$run_log" | tail -n 1)
    averaged=$(last_match 'averaged last [0-9]+: BLEU ([0-9.]+)' "$run_log")
    parameters=$(last_match 'model: ([0-9,]+) parameters' "$run_log" | tr -d ,)
    curve=$(sed -nE 's/.*validation step [0-9]+ .* BLEU ([0-9.]+) .*after ([0-9.]+) min of training.*/\1@\2/p' \
            "$run_log" | paste -sd ' ' -)
    if [[ -z $best ]]; then
        problem="no 'done:' line in $run_log"
        return 1
    fi
}

# "yes"/"no (minute M: A against B)" for curve $1 above curve $2 at each whole minute both reach
# (the last validation at or before it), or "no whole minute" in a run shorter than one.
above_at_every_minute() {  # curve other
    awk -v a="$1" -v b="$2" '
        function at(curve, minute,   n, i, pair, value) {
            n = split(curve, points, " "); value = ""
            for (i = 1; i <= n; i++) { split(points[i], pair, "@"); if (pair[2] + 0 <= minute) value = pair[1] }
            return value
        }
        function last_minute(curve,   n, pair) { n = split(curve, points, " "); split(points[n], pair, "@"); return pair[2] + 0 }
        BEGIN {
            end = last_minute(a) < last_minute(b) ? last_minute(a) : last_minute(b)
            verdict = ""
            for (m = 1; m <= end + 1e-9; m++) {
                x = at(a, m); y = at(b, m)
                if (x == "" || y == "") continue
                if (verdict == "") verdict = "yes"
                if (x + 0 <= y + 0) { verdict = sprintf("no (minute %d: %s against %s)", m, x, y); break }
            }
            print verdict == "" ? "no whole minute" : verdict
        }'
}

step_train() {
    header 2 "multi30k_transformer_gpu, then multi30k_transformer, $PRECISION, $([[ $MODE == dry ]] && echo '12 steps each' || echo '3 minutes each')"
    local started log=$OUT_DIR/2_train.log ceiling share gpu_curve gpu_line
    started=$(now)
    # Each run gets at most 290 s (dry run 60), keeping back what the steps after it take.
    local later=0 cap=290 second=240 step_number
    [[ $MODE == dry ]] && cap=60 second=20
    for step_number in $STEPS; do
        ((step_number > 2)) && later=$((later + $([[ $MODE == dry ]] && echo 20 || echo 60)))
    done
    if ! train_preset train "$log" "$(allowed $cap $((second + later)))" "${TRAIN[@]}"; then
        result 2 train FAILED "$problem" "$started"
        return
    fi
    # Training FLOP per target token taken as 6 x parameters (forward 2, backward 4; it counts
    # the source embedding, which multiplies nothing, and leaves out attention's own products).
    share="no GPU"
    if [[ $MODE == gpu ]] && ceiling=$(matmul_ceiling 2>>"$log") && [[ -n $ceiling ]]; then
        share=$(awk -v t="${tok:-0}" -v p="${parameters:-0}" -v c="$ceiling" \
                'BEGIN { printf "%.1f TFLOP/s at 6 x %.1f M parameters a token, %.1f %% of the %d TFLOP/s bf16 ceiling measured here", t * 6 * p / 1e12, p / 1e6, 100 * t * 6 * p / (c * 1e12), c }')
    fi
    gpu_curve=$curve
    gpu_line="$(thousands "${tok:-0}") target tok/s (median of the log lines; $share), best val BLEU (greedy) $best${averaged:+, averaged checkpoint $averaged}; val BLEU@minutes: $curve"
    # The CPU preset on the same GPU: the curve the GPU preset must stay above.
    if ! train_preset train_cpu_preset "$log" "$(allowed $cap $later)" "${TRAIN_CPU_PRESET[@]}"; then
        result 2 train FAILED "$gpu_line; the CPU preset: $problem" "$started"
        return
    fi
    result 2 train ok "$gpu_line; the CPU preset multi30k_transformer on this device: $(thousands "${tok:-0}") target tok/s, best val BLEU (greedy) $best${averaged:+, averaged checkpoint $averaged}; val BLEU@minutes: $curve; the GPU preset above it at every minute: $(above_at_every_minute "$gpu_curve" "$curve")" "$started"
}

# -- 3: beam 5 on the validation split -------------------------------------------------------
step_beam() {
    header 3 "beam 5 decoding of the validation split"
    local started log=$OUT_DIR/3_beam.log status checkpoint=$WORK/train/checkpoints/best.pt rate bleu
    started=$(now)
    if [[ ! -f $checkpoint ]]; then
        result 3 beam FAILED "no $checkpoint (step 2 made none)" "$started"
        return
    fi
    limited "$(allowed 90)" "$log" "$PYTHON" evaluate.py "checkpoint=$checkpoint" split=valid \
        beam_size=5 "device=$DEVICE" "${EVALUATE[@]}"
    status=$?
    rate=$(last_match '\(([0-9.]+) sentences/s\)' "$log")
    bleu=$(last_match '^BLEU[^=]* = ([0-9.]+)' "$log")
    if ((status != 0)) || [[ -z $rate ]]; then
        result 3 beam FAILED "$(failure $status "$log")" "$started"
        return
    fi
    result 3 beam ok "$rate sentences/s, BLEU $bleu ($(last_match 'test set: +([^,]*)' "$log"), fp32)" "$started"
}

# -- 4: torchrun, one rank in a process group ------------------------------------------------
step_torchrun() {
    header 4 "torchrun --nproc_per_node=1, $BACKEND process group, DistributedDataParallel"
    local started log=$OUT_DIR/4_torchrun.log status run_log joined steps
    started=$(now)
    # train.py under torchrun: its one rank joins a process group and trains under DDP.
    limited "$(allowed 120)" "$log" "$PYTHON" -m torch.distributed.run --standalone \
        --nproc_per_node=1 train.py experiment=multi30k_transformer "${RUN[@]}" \
        "trainer.precision=$PRECISION" trainer.max_time=null "trainer.max_steps=$STEPS_DDP" \
        "trainer.valid_every=$STEPS_DDP" "trainer.save_every=$STEPS_DDP" trainer.average_last=null \
        trainer.valid.max_sentences=200 "hydra.run.dir=$WORK/ddp"
    status=$?
    run_log=$WORK/ddp/train.log
    joined=$(last_match "(rank 0 of 1 joined the [a-z]+ process group)" "$run_log" 2>/dev/null)
    steps=$(last_match 'done: ([0-9]+) steps' "$run_log" 2>/dev/null)
    if ((status != 0)) || [[ -z $joined || $steps != "$STEPS_DDP" ]] \
            || ! grep -q "parameters identical on all 1 ranks" "$run_log"; then
        result 4 torchrun FAILED "$( ((status)) && failure $status "$log" || echo "expected '$BACKEND' group, $STEPS_DDP steps and the ranks' check in $run_log; got '${joined}', '${steps}' steps")" "$started"
        return
    fi
    result 4 torchrun ok "$joined, DDP, $steps steps, $(last_match '(parameters identical on all 1 ranks)' "$run_log"), val BLEU $(last_match 'best BLEU ([0-9.]+)' "$run_log") (200 sentences at most)" "$started"
}

# -- 5: stop and resume ----------------------------------------------------------------------
step_resume() {
    header 5 "resume: $STEPS_RESUME steps, then trainer.resume=auto to $((2 * STEPS_RESUME))"
    local started log=$OUT_DIR/5_resume.log status resumed steps common
    started=$(now)
    common=(experiment=multi30k_transformer "${RUN[@]}" "trainer.precision=$PRECISION" trainer.max_time=null
            "trainer.valid_every=$STEPS_RESUME" "trainer.save_every=$STEPS_RESUME"
            trainer.average_last=null trainer.valid.max_sentences=100 "hydra.run.dir=$WORK/resume")
    limited "$(allowed 90)" "$log" "$PYTHON" train.py "${common[@]}" \
        "trainer.max_steps=$STEPS_RESUME"
    status=$?
    if ((status == 0)); then
        limited "$(allowed 90)" "$log" "$PYTHON" train.py "${common[@]}" \
            "trainer.max_steps=$((2 * STEPS_RESUME))" trainer.resume=auto
        status=$?
    fi
    resumed=$(last_match 'resumed from .* at step ([0-9]+)' "$WORK/resume/train.log" 2>/dev/null)
    steps=$(last_match 'done: ([0-9]+) steps' "$WORK/resume/train.log" 2>/dev/null)
    if ((status != 0)); then
        result 5 resume FAILED "$(failure $status "$log")" "$started"
    elif [[ $resumed != "$STEPS_RESUME" || $steps != $((2 * STEPS_RESUME)) ]]; then
        result 5 resume FAILED "resumed at step '${resumed}', ended at '${steps}' (expected $STEPS_RESUME, $((2 * STEPS_RESUME)))" "$started"
    else
        result 5 resume ok "stopped at step $STEPS_RESUME, resumed at step $resumed, ended at step $steps" "$started"
    fi
}

if [[ $setup_status == ok ]]; then
    for step in $STEPS; do
        case $step in
            1) step_tests ;; 2) step_train ;; 3) step_beam ;; 4) step_torchrun ;; 5) step_resume ;;
        esac
    done
fi

# -- the summary -----------------------------------------------------------------------------
{
    echo "GPU check ($MODE run) of $(git rev-parse --short HEAD 2>/dev/null || echo 'this tree'), $(date -u '+%Y-%m-%d'), $(($(date +%s) - START)) s in all:"
    echo
    echo "| step | result | seconds |"
    echo "| --- | --- | ---: |"
    printf '%s\n' "${ROWS[@]}"
} >"$OUT_DIR/summary.md"
[[ -s $OUT_DIR/0_setup.log ]] || rm -f "$OUT_DIR/0_setup.log"
echo
echo "==== summary ($OUT_DIR/summary.md) ===="
cat "$OUT_DIR/summary.md"
if ((FAILED)); then
    echo "GPU check: FAILED (see the logs in $OUT_DIR)"
    exit 1
fi
echo "GPU check: all steps ok"
