#!/usr/bin/env bash
# Run here (a machine that reaches the package registry) before the GPU session: puts the
# controller's pure-Python dependencies that a vLLM environment may lack into
# build/gpu-check-deps, which the GPU session carries (a few MiB).
set -eu
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
rm -rf "$ROOT/build/gpu-check-deps"
"${PYTHON:-python3}" -m pip install --quiet --no-compile --target "$ROOT/build/gpu-check-deps" \
  attrs cattrs pluggy
du -sh "$ROOT/build/gpu-check-deps"
