# Quick start: `make train` (install, fetch Multi30k, train the default model) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# On a CPU-only machine set TORCH_SPEC=torch==2.13.0 (or another CPU wheel) to avoid a multi-GB CUDA build.
TORCH_SPEC ?= torch
ARGS ?=

.PHONY: install data train test lint bench clean

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

# Two pytest-xdist workers, one per core; worksteal keeps both busy to the end.
test: install
	$(BIN)/python -m pytest -q -n 2 --dist worksteal $(ARGS)

lint: install
	$(BIN)/ruff check .

bench: install
	$(BIN)/python scripts/bench.py $(ARGS)

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
