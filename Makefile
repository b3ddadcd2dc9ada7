# Quick start: `make train` (install, fetch Multi30k, train the default model) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# On a CPU-only machine set TORCH_SPEC=torch==2.13.0 (or another CPU wheel) to avoid a multi-GB CUDA build.
TORCH_SPEC ?= torch
ARGS ?=

.PHONY: install data train best best-transformer best-mixed study study-transformer study-report test lint bench gpu-check gpu-wheels clean

install: $(VENV)/.installed web/node_modules/.installed

# pip byte-compiles the ~16,000 installed modules one after another (69 s of a 122 s install on
# the AVX2 EPYC's 2 cores); compileall on every core does the same in 46 s there, and faster on more
# cores. Its failures are ignored, as pip's are: a few third-party files are for newer Pythons.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet --no-compile -e ".[dev]"
	$(BIN)/python -m compileall -q -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" > /dev/null || true
	touch $@

# The page seq2seq-export format=web writes copies ONNX Runtime Web and sentencepiece-js from
# here (the versions web/package-lock.json pins). Without npm the format refuses, in one line.
web/node_modules/.installed: web/package-lock.json
	if ! command -v npm >/dev/null; then echo "no npm: seq2seq-export format=web is unavailable"; \
	elif npm ci --prefix web --no-audit --no-fund --ignore-scripts --loglevel=error; then touch $@; \
	else echo "npm ci --prefix web failed: seq2seq-export format=web is unavailable"; fi

data: install
	$(BIN)/python -m seq2seq.cli.prepare_data $(ARGS)

train: install
	$(BIN)/python train.py $(ARGS)

# The multi30k_best ensemble (docs/results.md): scripts/best.sh, whose top comment says more.
# Other seeds: `make best BEST_SEEDS="3 4" BEST_DIR=runs/best34`.
BEST_DIR ?= runs/best
BEST_SEEDS ?= 1 2
best: install
	PYTHON=$(BIN)/python BEST_DIR="$(BEST_DIR)" BEST_SEEDS="$(BEST_SEEDS)" scripts/best.sh $(ARGS)

# The same with two multi30k_transformer members (scripts/best_transformer.sh), or with a
# Transformer beside a multi30k_best RNN (one tokenizer: the presets share it).
best-transformer: install
	PYTHON=$(BIN)/python BEST_DIR="$(or $(BEST_TRANSFORMER_DIR),runs/best_transformer)" \
		BEST_SEEDS="$(BEST_SEEDS)" scripts/best_transformer.sh $(ARGS)
best-mixed: install
	PYTHON=$(BIN)/python BEST_DIR="$(or $(BEST_MIXED_DIR),runs/best_mixed)" BEST_SEEDS="$(BEST_SEEDS)" \
		BEST_EXPERIMENTS="multi30k_transformer multi30k_best" scripts/best.sh $(ARGS)

# The attention study (docs/study.md): scripts/study.sh (the RNN grid), scripts/study_transformer.sh
# (the Transformer row), both ending with scripts/study_report.sh (records, then the report).
# A few seeds at a time: `make study STUDY_SEEDS=3,4,5`.
STUDY_DIR ?= runs/attention_study
STUDY_SEEDS ?= 1,2,3,4,5
STUDY_JOBS ?= 2
STUDY_SCORERS ?= gaussian,scaled_dot,additive,multihead,location,dot,general
STUDY_SPARSEMAX ?= scaled_dot
STUDY_RECORDS ?= docs/attention_study/runs
STUDY_TRANSFORMER_STEPS ?= 4000
STUDY_PRECISION ?= bf16
STUDY_ENV = PYTHON=$(BIN)/python STUDY_DIR="$(STUDY_DIR)" STUDY_SEEDS="$(STUDY_SEEDS)" \
	STUDY_JOBS="$(STUDY_JOBS)" STUDY_SCORERS="$(STUDY_SCORERS)" STUDY_SPARSEMAX="$(STUDY_SPARSEMAX)" \
	STUDY_RECORDS="$(STUDY_RECORDS)" STUDY_TRANSFORMER_STEPS="$(STUDY_TRANSFORMER_STEPS)" \
	STUDY_PRECISION="$(STUDY_PRECISION)"
study: install
	$(STUDY_ENV) scripts/study.sh $(ARGS)

study-transformer: install
	$(STUDY_ENV) scripts/study_transformer.sh $(ARGS)

study-report: install
	$(STUDY_ENV) scripts/study_report.sh

# Two pytest-xdist workers, one per core; worksteal keeps both busy to the end.
test: install
	$(BIN)/python -m pytest -q -n 2 --dist worksteal $(ARGS)

# The GPU check (docs/results.md#gpu-check): scripts/gpu_check.sh, at most 14 minutes on one GPU
# and no network; `make gpu-check ARGS=--dry-run` runs the same steps on the CPU in about a
# minute. No install: the GPU machine's image brings torch, and `make gpu-wheels` (here, online)
# the wheels of what it lacks (wheels/).
gpu-check:
	PYTHON=$(BIN)/python scripts/gpu_check.sh $(ARGS)

gpu-wheels: install
	PYTHON=$(BIN)/python scripts/gpu_wheels.sh

lint: install
	$(BIN)/ruff check .

bench: install
	$(BIN)/python -m benchmarks.bench $(ARGS)

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache web/node_modules
