#!/usr/bin/env bash
# Fuzzes fsc's file readers with libFuzzer (issue 13, item 8): the safetensors
# reader, the token readers (llm.c shards v1 and v7, nanoGPT, bytes), the
# checkpoint state.json reader, the flat-shard metadata reader, the GPT-2 BPE
# vocabulary/merges reader and encoder, Hugging Face tokenizer.json, fsc-train's --config and
# config.json readers, fsc-plot's metrics-line reader and fsc-tokenize's input reader
# (tests/fuzz/).
#
#   scripts/fuzz.sh [SECONDS] [HARNESS...]
#
# Builds build-fuzz/ with clang and -DFSC_FUZZ=ON (libfsc instrumented with
# ASan + UBSan + coverage), replays every committed seed (the regressions
# included), then runs each harness for SECONDS (default 60; the issue's
# long run is `scripts/fuzz.sh 1800`, 30 minutes each), one at a time. New
# inputs collect in build-fuzz/corpus/<harness> (kept between runs; copy the
# interesting ones into tests/fuzz/corpus/ by hand); a crash leaves
# build-fuzz/artifacts/<harness>-crash-* and makes the script exit 1.
# HARNESS: safetensors tokens state_json flat_layout bpe tokenizer_json config plot_rows
# tokenize_input (default: all).
# FSC_FUZZ_BUILD names another build directory (default build-fuzz).
# Invocations may run side by side, one harness each (`nice -n 19
# scripts/fuzz.sh 1800 bpe & nice -n 19 scripts/fuzz.sh 1800 config`): they
# take turns at the build step.
# Prints one line per harness: executions, seconds, new corpus size, crashes.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
harnesses=("$@")
[ ${#harnesses[@]} -eq 0 ] && harnesses=(safetensors tokens state_json flat_layout bpe tokenizer_json config plot_rows
  tokenize_input)
if ! command -v clang >/dev/null; then
  echo "fuzz: clang not found (scripts/install-deps.sh installs it)" >&2
  exit 77
fi
build=${FSC_FUZZ_BUILD:-build-fuzz}
mkdir -p "$build"
targets=()
for h in "${harnesses[@]}"; do targets+=("fsc_fuzz_$h"); done
# One build at a time: several invocations (one harness each, run side by
# side for the long runs) share the build directory.
exec 9>"$build/.fuzz-build.lock"
flock 9
CC=clang cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DFSC_WERROR=ON -DFSC_FUZZ=ON \
  -DFSC_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >/dev/null
flock -u 9
mkdir -p "$build/artifacts"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=0
for h in "${harnesses[@]}"; do
  bin=$build/tests/fuzz/fsc_fuzz_$h
  seeds=tests/fuzz/corpus/$h
  work=$build/corpus/$h
  mkdir -p "$work"
  log=$build/fuzz-$h.log
  # every committed seed first: a regression crashes here, whatever the time
  if ! "$bin" -runs=0 "$seeds" >"$log" 2>&1; then
    echo "fuzz $h: a committed seed fails (see $log)" >&2
    tail -30 "$log" >&2
    failed=1
    continue
  fi
  rc=0
  "$bin" -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
    -dict=tests/fuzz/$h.dict -print_final_stats=1 -artifact_prefix="$build/artifacts/$h-" \
    "$work" "$seeds" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  took=$(sed -n 's/.*Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
  corpus=$(find "$work" -type f | wc -l)
  if [ "$rc" -ne 0 ]; then
    echo "fuzz $h: CRASH after ${execs:-?} executions (exit $rc); artifacts in $build/artifacts, log $log" >&2
    grep -E "ERROR|runtime error|SUMMARY|Test unit written" "$log" | head -10 >&2
    failed=1
  else
    echo "fuzz $h: ${execs:-?} executions in ${took:-$seconds} s, 0 crashes (corpus $corpus new inputs)"
  fi
done
exit $failed
