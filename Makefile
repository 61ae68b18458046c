# One-command set-up on a fresh machine: `make test` or `make repro` creates .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
# torch==2.13.0 as the package index pip uses serves it (PyPI's Linux wheel carries CUDA); pick
# another build, e.g. `make setup TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"`.
TORCH_SPEC ?= torch==$(TORCH_VERSION)

# Every package pinned: the environment README's results were made with (pip constraints).
LOCK := requirements.lock
EXTRAS := dev,export,docs
# The lab's peer model (the `bench` extra: Hugging Face transformers) and the packages only it
# needs go in a folder beside the environment's, not into it (the lock pins them all the same):
# torchmetrics imports transformers wherever it is installed, seconds in every process that
# imports Lightning, and nothing in pipeline/ uses it (pipeline/environment.py's PEERS_DIR; the
# lab adds the folder to its path).
PEERS := $(VENV)/peers
PEER_EXTRA := bench
PEER_PACKAGES := transformers tokenizers safetensors typer shellingham annotated-doc

.PHONY: setup test lint repro smoke params plots exps clean lock docs help

# Written after the last install succeeded: a set-up that failed half-way (the venv exists,
# a package does not) is redone by the next make, not taken for done.
INSTALLED := $(VENV)/.installed
$(INSTALLED):
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c $(LOCK) --upgrade pip
	$(BIN)/pip install --quiet -c $(LOCK) "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -c $(LOCK) -e ".[$(EXTRAS)]"
	$(BIN)/pip install --quiet -c $(LOCK) --no-deps --upgrade --target $(PEERS) $(PEER_PACKAGES)
	touch $(INSTALLED)

setup: $(INSTALLED)  ## create .venv with every package pinned by requirements.lock

# The fast suite plus the marked slow end-to-end tests (what CI runs), on TEST_WORKERS pytest
# processes of one thread each (pytest-xdist). The slow tests come first (tests/conftest.py) and
# are handed out one at a time, so the long ones run side by side and the short ones fill in.
TEST_WORKERS ?= 2
test: setup  ## the fast and the slow tests (what CI runs), on TEST_WORKERS processes
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist load --maxschedchunk 1 --durations=30 tests

lint: setup  ## ruff check and ruff format --check
	$(BIN)/ruff check pipeline tests benchmarks
	$(BIN)/ruff format --check pipeline tests benchmarks

# The main job: the default experiment, end to end. params.yaml is recomposed from conf/
# first (and says which experiment it holds), so a preset that `dvc exp run -S
# experiment=...` left there never passes for the default. REPRO_ARGS go to `dvc repro`.
# Both this and `make smoke` end with the run's test BLEU, also when DVC had nothing to run.
REPRO_ARGS ?=
repro: setup  ## the default experiment end to end (dvc repro), then its test BLEU
	$(BIN)/python -m pipeline.params
	. $(BIN)/activate && dvc repro $(REPRO_ARGS)
	$(BIN)/python -m pipeline.summary

smoke: setup  ## the whole pipeline on the smoke preset (dvc exp run), then its test BLEU
	. $(BIN)/activate && dvc exp run -S experiment=smoke
	$(BIN)/python -m pipeline.summary

# The documentation site into site/ (`mkdocs serve` to read it while editing docs/).
docs: setup  ## the documentation site into site/
	$(BIN)/mkdocs build --strict

# Recompose params.yaml from conf/ (DVC does this itself on `dvc exp run`).
params: setup  ## recompose params.yaml from conf/
	$(BIN)/python -m pipeline.params

# DVC's plots as a page that works offline (dvc_plots/index.html): .dvc/config's page template
# has Vega inline. DVC options go in PLOTS_ARGS (e.g. `-o <dir>`).
PLOTS_ARGS ?=
plots: setup  ## DVC's plots as a page that works offline (dvc_plots/index.html)
	. $(BIN)/activate && dvc plots show $(PLOTS_ARGS)

# The experiments on one screen, 80 columns too: what each changed, val and test BLEU (lc),
# updates, training wall time, best first. EXPS_ARGS go to `dvc exp show` (e.g. `-A`).
EXPS_ARGS ?=
exps: setup  ## the experiments on one screen, best first
	. $(BIN)/activate && python -m pipeline.experiments $(EXPS_ARGS)

# Re-resolve pyproject.toml's ranges into $(LOCK) in a scratch environment (after changing a
# dependency; commit the result). Torch's local build tag (+cpu, +cu128) is dropped from the
# pin, so one lock serves the CPU and the CUDA wheel of the same release.
lock:  ## re-resolve requirements.lock from pyproject.toml in a scratch environment
	rm -rf .lock-venv
	$(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet --upgrade pip
	.lock-venv/bin/pip install --quiet "$(TORCH_SPEC)"
	.lock-venv/bin/pip install --quiet -e ".[$(EXTRAS),$(PEER_EXTRA)]"
	{ echo "# make lock: every package of .[$(EXTRAS),$(PEER_EXTRA)] with $(TORCH_SPEC), Python $$(.lock-venv/bin/python -c 'import platform; print(platform.python_version())')"; \
	  .lock-venv/bin/pip freeze --all --exclude-editable | sed -E 's/^(torch==[^+]+)\+.*/\1/'; } > $(LOCK)
	rm -rf .lock-venv

clean:  ## delete the pipeline's outputs (prepared data, models, eval, metrics, plots)
	rm -rf data/prepared data/tokenized models eval metrics plots wandb_runs dvclive dvc_plots site

# Each target's description is the `## ` comment on its rule line.
help:  ## this list
	@awk -F ':.*## ' '/^[a-z][a-z-]*:.*## / {printf "  %-7s %s\n", $$1, $$2}' \
	  $(firstword $(MAKEFILE_LIST))
