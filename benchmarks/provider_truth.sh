#!/usr/bin/env bash
# The silent CPU fallback with the real GPU wheel (issue 30.1): onnxruntime-gpu lists
# CUDAExecutionProvider, but on a machine without the CUDA libraries (or a GPU) onnxruntime
# builds the session on the CPU provider and only logs it. `run --device cuda` must stop with
# an error naming the provider, the missing library and what to install, exit status 1.
#
# Usage: bash benchmarks/provider_truth.sh [MODEL_DIR]
#   MODEL_DIR  default /work/shared/models/smollm2-135m-instruct-int4-2layers
# Env: VENV (default /tmp/ort-gpu-venv): a side venv with ORT (default onnxruntime-gpu==1.31.1,
# a 255 MB wheel, 500 MB installed) and the project's other dependencies; this working tree is
# reinstalled into it on every run with --no-deps, so onnxruntime stays the GPU wheel.
# ORT="onnxruntime-gpu[cuda,cudnn]==1.31.1" VENV=/tmp/ort-gpu-libs-venv adds the CUDA 13 and
# cuDNN pip libraries (2.6 GB installed): a machine with the libraries but no driver or GPU.
# Exit status 0 when the run failed as it must, 1 when it ran (on the CPU), 2 when the venv
# could not be made.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODEL=${1:-/work/shared/models/smollm2-135m-instruct-int4-2layers}
VENV=${VENV:-/tmp/ort-gpu-venv}
ORT=${ORT:-onnxruntime-gpu==1.31.1}
PY=${PYTHON:-python3}
LOG=$VENV.install.log

if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV (pip output in $LOG)"
  "$PY" -m venv "$VENV" || exit 2
fi
if ! "$VENV/bin/python" -c "import onnxruntime" 2>/dev/null; then
  # The project's dependencies but onnxruntime (the GPU wheel takes its place).
  DEPS=$("$VENV/bin/python" -c '
import sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
print(" ".join(d for d in deps if not d.startswith("onnxruntime")))' "$ROOT/pyproject.toml")
  # shellcheck disable=SC2086
  "$VENV/bin/pip" install "$ORT" $DEPS >"$LOG" 2>&1 \
    || { tail -20 "$LOG"; exit 2; }
fi
# Built from a copy (links followed: _data/ links to schemas/, presets/): pip builds a local
# folder in place, leaving build/ and *.egg-info in the checkout.
SRC=$(mktemp -d)
cp -rL "$ROOT/pyproject.toml" "$ROOT/README.md" "$ROOT/genai_runtime" "$SRC/"
"$VENV/bin/pip" install --no-deps --force-reinstall "$SRC" >>"$LOG" 2>&1 \
  || { tail -20 "$LOG"; rm -rf "$SRC"; exit 2; }
rm -rf "$SRC"

"$VENV/bin/python" -c 'import onnxruntime as o
print("== onnxruntime", o.__version__, o.get_device(), o.get_available_providers())'
echo "== GPU: $(nvidia-smi -L 2>/dev/null | head -1 | grep . || echo none)"
echo "== \$ genai-runtime run $MODEL --device cuda --prompt hi --max-new-tokens 4"
cd /tmp || exit 2  # the installed package, not the source tree
"$VENV/bin/genai-runtime" run "$MODEL" --device cuda --prompt hi --max-new-tokens 4 2>&1
rc=$?
echo "== exit status $rc"
[ "$rc" -ne 0 ]
