#!/usr/bin/env bash
# Build a throwaway virtual environment with mosaicml/llm-foundry (and its Composer pin) on CPU, for
# benchmarks/lf_parity.py. Usage: benchmarks/lf_env.sh [VENV_DIR] [LLM_FOUNDRY_VERSION] [TORCH_VERSION]
# Defaults: /tmp/lf_venv, 0.22.0, 2.7.0. The venv lives outside the repository; delete it when done.
# torch 2.7.0 from PyPI is the CUDA 12.6 build (with its nvidia-* wheels, about 6 GB in all); it runs on CPU.
# Built on 2026-11-23: llm-foundry 0.22.0, mosaicml (Composer) 0.32.1, torch 2.7.0, transformers 4.51.3,
# mosaicml-streaming 0.12.0, in about 5 minutes.
set -euo pipefail
VENV=${1:-/tmp/lf_venv}
LF_VERSION=${2:-0.22.0}
TORCH_VERSION=${3:-2.7.0}
PYTHON=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --quiet --progress-bar off)
quiet() { "$@" 2> >(grep -v "^WARNING: Location 'file:" >&2); }  # this machine's pip config names absent indexes
# torch first, so llm-foundry's pin (torch<2.7.1 for 0.22.0) is met by a build we chose; no GPU extras.
quiet "${PIP[@]}" "torch==${TORCH_VERSION}"
quiet "${PIP[@]}" "llm-foundry==${LF_VERSION}" "torch==${TORCH_VERSION}"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("llm-foundry", "mosaicml", "torch", "transformers", "mosaicml-streaming"):
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name}: not installed")
PY
echo "ready: $VENV/bin/python"
