# One-command set-up on a fresh machine: `make test` or `make repro` creates .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
# On this machine torch==2.13.0 resolves to a local CPU build; elsewhere pick the wheel you need,
# e.g. `make setup TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu124"`.
TORCH_SPEC ?= torch==$(TORCH_VERSION)

.PHONY: setup test test-all lint repro smoke params clean

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[dev,bench]"

setup: $(BIN)/activate

# The fast suite plus the marked slow end-to-end tests (what CI runs).
test: setup
	$(BIN)/python -m pytest -q tests

lint: setup
	$(BIN)/ruff check pipeline tests benchmarks
	$(BIN)/ruff format --check pipeline tests benchmarks

# The main job: the default experiment, end to end.
repro: setup
	. $(BIN)/activate && dvc repro

smoke: setup
	. $(BIN)/activate && dvc exp run -S experiment=smoke

# Recompose params.yaml from conf/ (DVC does this itself on `dvc exp run`).
params: setup
	$(BIN)/python -m pipeline.config > params.yaml

clean:
	rm -rf data/prepared data/tokenized models eval metrics plots wandb_runs dvclive
