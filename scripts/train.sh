#!/usr/bin/env bash
# README command 1: installs what is missing, builds, and trains the default GPT
# on the built-in corpus, printing progress and a summary. Extra arguments go
# to fsc-train (e.g. --steps 500).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
mkdir -p out
exec build/tools/fsc-train --data builtin --metrics out/metrics.jsonl --save out/model.safetensors "$@"
