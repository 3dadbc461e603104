#!/usr/bin/env bash
# Install llmfoundry (editable) and its dependencies into the current Python environment.
#
#   bash scripts/install.sh          # what training needs
#   bash scripts/install.sh dev      # plus what the tests need (extras are comma-separated: dev,eval)
#
# An installed torch is kept as it is (a CPU build stays a CPU build); with no torch, torch==2.13.0 is installed.
# streaming-community pulls in torchvision, whose PyPI build can fail to import next to a CPU torch and then
# breaks `import transformers`; such a torchvision is removed again (llmfoundry does not need it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
PIP=("$PY" -m pip install --disable-pip-version-check --quiet --progress-bar off)

if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "installing torch==2.13.0"
  "${PIP[@]}" "torch==2.13.0"
fi
torch_version="$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==${torch_version}" > "$constraints"

target="."
[ -n "${1:-}" ] && target=".[$1]"
echo "installing llmfoundry${1:+[$1]} (keeping torch ${torch_version})"
"${PIP[@]}" -c "$constraints" -e "$target"

case ",${1:-}," in
  *,dev,*) # the Azure tests' emulator (npm); without npm they skip, saying so
    if azurite="$(bash tests/setup_azurite.sh)"; then echo "azurite: $azurite"; else echo "azurite not installed"; fi
    # torchao (the float8 extra) beside the environment, not in it: installed, transformers would import it in every
    # process that loads a model (1-2 s each); the float8 tests find it here (tests/helpers.FLOAT8_LIBRARIES)
    "${PIP[@]}" --no-deps --upgrade --target .extras/float8 "torchao>=0.18";;
esac

if "$PY" -m pip show torchvision >/dev/null 2>&1 && ! "$PY" -c "import torchvision" >/dev/null 2>&1; then
  echo "removing a torchvision that does not import with this torch"
  "$PY" -m pip uninstall --quiet -y torchvision
fi
"$PY" -c "import torch, transformers, llmfoundry; print(f'ready: torch {torch.__version__}, transformers {transformers.__version__}')"
