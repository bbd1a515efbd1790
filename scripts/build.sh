#!/usr/bin/env bash
# Configures and builds fsc into build/ (Release, warnings as errors).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFSC_WERROR=ON >/dev/null
cmake --build build -j "$(nproc)"
