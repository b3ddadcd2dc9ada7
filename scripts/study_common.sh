# Sourced by study.sh and study_transformer.sh after common.sh: the study's shared settings.

STUDY_DIR=${STUDY_DIR:-runs/attention_study}
STUDY_SEEDS=${STUDY_SEEDS:-1,2,3,4,5}
STUDY_JOBS=${STUDY_JOBS:-2}
STUDY_RECORDS=${STUDY_RECORDS:-docs/attention_study/runs}
# The precision seeds 1-5 trained in (bf16, on the AVX512-BF16 EPYC), pinned so that a new seed
# joins them whatever precision=auto would choose. Where torch has no bf16 kernels it emulates
# them (about 25 times slower than fp32): STUDY_PRECISION=fp32 there makes groups of their own.
STUDY_PRECISION=${STUDY_PRECISION:-bf16}
# study_report.sh, run at the end, reads the same folders and interpreter.
export STUDY_DIR STUDY_RECORDS PYTHON

# What every study run shares: side by side on one core each, resumable, validated every 250
# steps, best.pt chosen on val.
study_sweep=("$PYTHON" train.py -m hydra/launcher=joblib hydra.launcher.n_jobs="$STUDY_JOBS"
    hydra.sweep.dir="$STUDY_DIR" trainer.num_threads=1 trainer.resume=auto trainer.max_time=null
    trainer.valid_every=250 trainer.precision="$STUDY_PRECISION" trainer.seed="$STUDY_SEEDS")
