#!/usr/bin/env bash
# Runs a Node.js client test (tests/serve/*.mjs) against `cellshard serve`.
#   node_client.sh SCRIPT CELLSHARD SHARED_DIR NPM_DIR
# NPM_DIR is a scratch folder where the pinned packages are installed once
# (openai@4.95.0, playwright-core@1.65.1). Without node/npm the test is
# skipped (exit 77) with a message, and fails when CI is set. The script
# starts the servers itself (it gets the binary and the model paths) and
# kills them on exit.
set -euo pipefail
script=$1 bin=$2 shared=$3 npmdir=$4
skip() {
  if [ -n "${CI:-}" ]; then echo "FAIL (CI is set): $1"; exit 1; fi
  echo "SKIP: $1"; exit 77
}
command -v node >/dev/null || skip "node is not installed (scripts/install-deps.sh installs it)"
command -v npm >/dev/null || skip "npm is not installed (scripts/install-deps.sh installs it)"
[ -f "$shared/models/stories260K.bin" ] || skip "$shared/models/stories260K.bin is missing"
mkdir -p "$npmdir"
if [ ! -f "$npmdir/node_modules/openai/package.json" ] || [ ! -f "$npmdir/node_modules/playwright-core/package.json" ]; then
  (cd "$npmdir" && [ -f package.json ] || echo '{"private": true}' > package.json)
  start=$(date +%s)
  (cd "$npmdir" && timeout 240 npm install --no-audit --no-fund --silent openai@4.95.0 playwright-core@1.65.1) ||
    skip "npm install openai@4.95.0 playwright-core@1.65.1 failed (no network?)"
  echo "npm install took $(( $(date +%s) - start )) s"
fi
export NODE_PATH="$npmdir/node_modules"
cd "$npmdir"
cp "$script" "$npmdir/"
exec timeout 240 node "$npmdir/$(basename "$script")" "$bin" "$shared/models" "$npmdir"
