#!/usr/bin/env bash
# README command 2: installs what is missing, builds, runs every test; then
# runs them again under AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
(cd build && ctest --output-on-failure -j "$(nproc)" "$@")

echo "== the same tests under ASan + UBSan =="
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Debug -DFSC_WERROR=ON -DFSC_ASAN=ON -DFSC_UBSAN=ON >/dev/null
cmake --build build-sanitize -j "$(nproc)" >/dev/null
(cd build-sanitize && ctest --output-on-failure -j "$(nproc)" "$@")
