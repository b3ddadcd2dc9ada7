# Quick start: `make train` (install, fetch Multi30k, train the default model) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# On a CPU-only machine set TORCH_SPEC=torch==2.13.0 (or another CPU wheel) to avoid a multi-GB CUDA build.
TORCH_SPEC ?= torch
ARGS ?=

.PHONY: install data train best study study-transformer study-report test lint bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

data: install
	$(BIN)/python -m seq2seq.cli.prepare_data $(ARGS)

train: install
	$(BIN)/python train.py $(ARGS)

# The multi30k_best result (README "Results"): two seeds trained side by side for the same 59
# minutes, one core each, then the beam settings of their ensemble chosen on val. Each member
# logs to $(BEST_DIR)/seedN.log (follow one with `tail -f runs/best/seed1.log`); score the
# chosen setting on test once with the command seq2seq-tune-decoding prints. Other seeds:
# `make best BEST_SEEDS="3 4" BEST_DIR=runs/best34`.
BEST_DIR ?= runs/best
BEST_SEEDS ?= 1 2
BEST_A = $(word 1,$(BEST_SEEDS))
BEST_B = $(word 2,$(BEST_SEEDS))
best: install
	mkdir -p $(BEST_DIR)
	@echo "training 2 members of multi30k_best side by side (62 minutes); logs: $(BEST_DIR)/seed$(BEST_A).log, $(BEST_DIR)/seed$(BEST_B).log"
	$(BIN)/python train.py experiment=multi30k_best trainer.num_threads=1 trainer.seed=$(BEST_A) \
		hydra.run.dir=$(BEST_DIR)/seed$(BEST_A) $(ARGS) > $(BEST_DIR)/seed$(BEST_A).log 2>&1 & first=$$!; \
	$(BIN)/python train.py experiment=multi30k_best trainer.num_threads=1 trainer.seed=$(BEST_B) \
		hydra.run.dir=$(BEST_DIR)/seed$(BEST_B) $(ARGS) > $(BEST_DIR)/seed$(BEST_B).log 2>&1 & second=$$!; \
	trap 'kill $$first $$second 2>/dev/null' INT TERM; \
	wait $$first; first_status=$$?; wait $$second; second_status=$$?; \
	test $$first_status -eq 0 && test $$second_status -eq 0 \
		|| { echo "a member failed: see the end of $(BEST_DIR)/seed$(BEST_A).log and seed$(BEST_B).log" >&2; exit 1; }
	$(BIN)/seq2seq-tune-decoding $(BEST_DIR)/seed$(BEST_A)/checkpoints/best.pt \
		$(BEST_DIR)/seed$(BEST_B)/checkpoints/best.pt --beam-sizes 1,5,8 --length-penalties 1.0,1.4

# The attention study (docs/study.md): every scorer, and sparsemax on STUDY_SPARSEMAX, x
# STUDY_SEEDS, each run trained until validation BLEU stops improving (4 validations in a row,
# 4,000 steps at most), STUDY_JOBS runs side by side on one core each. Run again, it trains only
# the runs missing from STUDY_DIR (trainer.resume=auto in a folder per setting); a run kept only
# as a record in git is trained again, so give the seeds that are not recorded yet. Each scored run
# becomes a record in docs/attention_study/runs/, and the report in docs/attention_study/ is
# rebuilt from all the records, so the study can grow a few seeds at a time:
# `make study STUDY_SEEDS=3,4,5`.
STUDY_DIR ?= runs/attention_study
STUDY_SEEDS ?= 1,2,3,4,5
STUDY_JOBS ?= 2
STUDY_SCORERS ?= gaussian,scaled_dot,additive,multihead,location,dot,general
STUDY_SPARSEMAX ?= scaled_dot
STUDY_RECORDS ?= docs/attention_study/runs
# What every study run shares: side by side on one core each, resumable, validated every 250
# steps, best.pt chosen on val.
STUDY_SWEEP = $(BIN)/python train.py -m hydra/launcher=joblib hydra.launcher.n_jobs=$(STUDY_JOBS) \
	hydra.sweep.dir=$(STUDY_DIR) trainer.num_threads=1 trainer.resume=auto trainer.max_time=null \
	trainer.valid_every=250 trainer.seed=$(STUDY_SEEDS)
# The RNN grid (constant learning rate) stops at the 4th validation in a row without a better BLEU.
STUDY_TRAIN = $(STUDY_SWEEP) experiment=multi30k_luong_fast trainer.max_steps=4000 \
	trainer.early_stopping_patience=4 \
	'hydra.sweep.subdir=$${hydra:runtime.choices.model/attention}-$${model.attention.normalizer}-seed$${trainer.seed}'
study: install
	$(STUDY_TRAIN) model/attention=$(STUDY_SCORERS) $(ARGS)
	$(STUDY_TRAIN) model/attention=$(STUDY_SPARSEMAX) model.attention.normalizer=sparsemax $(ARGS)
	$(MAKE) study-report

# The Transformer row of the study: multi30k_transformer x STUDY_SEEDS, trained to the end of its
# cosine schedule, which ends at STUDY_TRANSFORMER_STEPS instead of after 59 minutes (no early
# stopping: it would stop while the learning rate is still high; docs/study.md).
STUDY_TRANSFORMER_STEPS ?= 4000
study-transformer: install
	$(STUDY_SWEEP) experiment=multi30k_transformer trainer.max_steps=$(STUDY_TRANSFORMER_STEPS) \
		trainer.early_stopping_patience=null 'hydra.sweep.subdir=transformer-seed$${trainer.seed}' \
		$(ARGS)
	$(MAKE) study-report

# Score the finished runs of STUDY_DIR into records (each once), then rebuild the report from
# all the records.
study-report: install
	$(BIN)/python compare.py $(STUDY_DIR) split=test records_dir=$(STUDY_RECORDS) \
		plots=false test=none aso_iterations=0
	$(BIN)/python compare.py $(STUDY_RECORDS) split=test output_dir=docs/attention_study

# Two pytest-xdist workers, one per core; worksteal keeps both busy to the end.
test: install
	$(BIN)/python -m pytest -q -n 2 --dist worksteal $(ARGS)

lint: install
	$(BIN)/ruff check .

bench: install
	$(BIN)/python -m benchmarks.bench $(ARGS)

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
