#!/usr/bin/env bash
# README command 1: installs what is missing, builds, and trains the default
# GPT on the built-in corpus with one DDP rank per core (one process when no
# MPI launcher is installed), printing progress with the held-out loss every
# 50 steps and a summary, then draws the loss curve (out/loss.svg, from
# out/metrics.jsonl) and prints a sample of the trained model's text. Extra
# arguments go to fsc-train (e.g. --steps 500).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
mkdir -p out
args=(--data builtin --eval-every 50 --eval-batches 2 --metrics out/metrics.jsonl
      --save out/model.safetensors "$@")
launcher=$(grep -E '^MPIEXEC_EXECUTABLE:' build/CMakeCache.txt 2>/dev/null | cut -d= -f2 || true)
ranks=$(nproc)
if [ -n "$launcher" ] && [ -x "$launcher" ] && [ "$ranks" -gt 1 ]; then
  # Open MPI refuses root without these; harmless for MPICH.
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  "$launcher" -n "$ranks" build/tools/fsc-train --strategy ddp "${args[@]}"
else
  build/tools/fsc-train "${args[@]}"
fi
# Train loss (val points when --eval-every is given), lr and tokens/s against steps.
if [ -s out/metrics.jsonl ]; then
  build/tools/fsc-plot out/metrics.jsonl -o out/loss.svg --title "fsc-train: the README's main job"
  echo "loss curve: out/loss.svg (open it in a browser)" >&2
fi
# Text from the trained model (a KV cache; the built-in corpus is bytes).
if [ -s out/model.safetensors ]; then
  echo "sample (fsc-sample --model out/model.safetensors --max-new-tokens 200):" >&2
  build/tools/fsc-sample --model out/model.safetensors --max-new-tokens 200 --prompt "The " >&2
  echo >&2
fi
