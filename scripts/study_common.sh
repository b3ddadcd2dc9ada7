# Sourced by study.sh and study_transformer.sh after common.sh: the study's shared settings.

STUDY_DIR=${STUDY_DIR:-runs/attention_study}
STUDY_SEEDS=${STUDY_SEEDS:-1,2,3,4,5}
STUDY_JOBS=${STUDY_JOBS:-2}
STUDY_RECORDS=${STUDY_RECORDS:-docs/attention_study/runs}
# study_report.sh, run at the end, reads the same folders and interpreter.
export STUDY_DIR STUDY_RECORDS PYTHON

# What every study run shares: side by side on one core each, resumable, validated every 250
# steps, best.pt chosen on val.
study_sweep=("$PYTHON" train.py -m hydra/launcher=joblib hydra.launcher.n_jobs="$STUDY_JOBS"
    hydra.sweep.dir="$STUDY_DIR" trainer.num_threads=1 trainer.resume=auto trainer.max_time=null
    trainer.valid_every=250 trainer.seed="$STUDY_SEEDS")
