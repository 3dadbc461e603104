#!/usr/bin/env bash
# Azurite (the Azure Storage emulator, npm package `azurite`) for the Azure tests: prints the path of its
# `azurite-blob`. Idempotent: one already on PATH, or installed before, is used as it is; otherwise
# `npm install --prefix "$LLMFOUNDRY_AZURITE_DIR"` (default ~/.cache/llmfoundry/azurite) installs it.
# Called by `bash scripts/install.sh dev` (so CI installs it before the tests) and by the `azurite` fixture.
# Exit codes: 0 = installed (path on stdout); 3 = cannot be installed here (no npm: the tests skip, saying so);
# anything else = the install failed (the tests fail).
set -u
if command -v azurite-blob >/dev/null; then command -v azurite-blob; exit 0; fi
dir="${LLMFOUNDRY_AZURITE_DIR:-$HOME/.cache/llmfoundry/azurite}"
bin="$dir/node_modules/.bin/azurite-blob"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
    echo "cannot install azurite: needs node and npm" >&2; exit 3
fi
mkdir -p "$dir"
npm install --prefix "$dir" --no-audit --no-fund --silent "azurite@3" >"$dir/install.log" 2>&1 ||
    { echo "npm install azurite failed (see $dir/install.log)" >&2; exit 1; }
[ -x "$bin" ] || { echo "npm installed azurite but $bin is missing" >&2; exit 1; }
echo "$bin"
