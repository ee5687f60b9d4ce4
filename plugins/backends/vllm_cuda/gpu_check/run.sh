#!/usr/bin/env bash
# Run the vllm-cuda GPU check once on a machine with an NVIDIA GPU (see README.md).
# Usage: [EDGE_VLLM_PYTHON=/path/to/python] bash plugins/backends/vllm_cuda/gpu_check/run.sh [--rehearse-cpu]
# The record goes to $OUT/gpu_check.json (or build/gpu_check/gpu_check.json).
set -u
ROOT="$(cd "$(dirname "$0")/../../../.." && pwd)"
OUT_DIR="${OUT:-$ROOT/build/gpu_check}"
mkdir -p "$OUT_DIR"
VLLM_PYTHON="${EDGE_VLLM_PYTHON:-}"
if [ -z "$VLLM_PYTHON" ]; then
  for candidate in "$ROOT/.venv-vllm/bin/python" "$(command -v python3)"; do
    if [ -x "$candidate" ] && "$candidate" -c "import vllm" >/dev/null 2>&1; then
      VLLM_PYTHON="$candidate"; break
    fi
  done
fi
{
  echo "== nvidia-smi"; nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"
  echo "== vllm interpreter: ${VLLM_PYTHON:-none}"
} | tee "$OUT_DIR/environment.txt"
if [ -z "$VLLM_PYTHON" ]; then
  echo "BLOCKED: no interpreter with vLLM here; pass one or set EDGE_VLLM_PYTHON" \
    | tee -a "$OUT_DIR/environment.txt"
  exit 2
fi
# The controller runs on the same interpreter with edge-core from the tree; attrs, cattrs
# and pluggy come from the carried build/gpu-check-deps when the interpreter lacks them.
DEPS="$ROOT/build/gpu-check-deps"
export PYTHONPATH="$ROOT/contracts/src:$ROOT/core/src:$ROOT/plugins/backends/vllm_cuda/src${PYTHONPATH:+:$PYTHONPATH}"
[ -d "$DEPS" ] && export PYTHONPATH="$PYTHONPATH:$DEPS"
"$VLLM_PYTHON" "$ROOT/plugins/backends/vllm_cuda/gpu_check/gpu_check.py" \
  --vllm-python "$VLLM_PYTHON" --work "$OUT_DIR/work" --out "$OUT_DIR/gpu_check.json" "$@" \
  2>&1 | tee "$OUT_DIR/gpu_check.log"
exit "${PIPESTATUS[0]}"
