#!/usr/bin/env bash
# README command 2: installs what is missing, builds, runs every test; runs the
# numerics tests (ctest label `numerics`) again under fsc's own CPUID choice of
# BLAS kernels when the environment's OPENBLAS_CORETYPE gives other kernels, so
# that both kernel families are held to the same tolerances; then runs every
# test again under AddressSanitizer + UndefinedBehaviorSanitizer.
# Arguments go to every ctest run (e.g. -R golden).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh

# What fsc runs under the environment given as arguments (env ...): fsc-bench
# --blas-info loads OpenBLAS as the tests will and prints one JSON line.
blas_info() { "$@" build/tools/fsc-bench --blas-info; }
field() { sed -n "s/.*\"$1\": \"\\([^\"]*\\)\".*/\\1/p"; }
env_info=$(blas_info env)
cpu_info=$(blas_info env -u OPENBLAS_CORETYPE)
env_kernels=$(field corename <<<"$env_info")
cpu_kernels=$(field corename <<<"$cpu_info")

echo "== Release: every test, environment's kernels (OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-unset}): $(field blas <<<"$env_info")"
SECONDS=0
(cd build && ctest --output-on-failure -j "$(nproc)" "$@")
echo "== Release pass: ${SECONDS}s"

if [ "$env_kernels" != "$cpu_kernels" ]; then
  echo "== Release: numerics tests again, fsc's CPUID choice (env -u OPENBLAS_CORETYPE): $(field blas <<<"$cpu_info")"
  SECONDS=0
  (cd build && env -u OPENBLAS_CORETYPE ctest --output-on-failure -j "$(nproc)" -L numerics "$@")
  echo "== Release numerics pass under $cpu_kernels kernels: ${SECONDS}s"
elif [ -z "${OPENBLAS_CORETYPE+set}" ]; then
  echo "== OPENBLAS_CORETYPE is unset: the Release pass ran fsc's CPUID choice ($cpu_kernels kernels); no second numerics pass"
else
  echo "== OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE gives fsc's CPUID choice ($cpu_kernels kernels); no second numerics pass"
fi

echo "== the same tests under ASan + UBSan =="
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Debug -DFSC_WERROR=ON -DFSC_ASAN=ON -DFSC_UBSAN=ON >/dev/null
cmake --build build-sanitize -j "$(nproc)" >/dev/null
(cd build-sanitize && ctest --output-on-failure -j "$(nproc)" "$@")
