#!/usr/bin/env bash
# Flash attention's speed targets (issue 26): whole fsc-train runs at the
# medium width (L8 C512 H8 V8192), one process, one thread, alternated in
# each round: fp32 naive and flash at T = 2048 batch 1, bf16 flash
# (--mixed-precision bf16) at T = 2048, then fp32 naive and flash at T = 256
# batch 4. Per run it prints the mean tokens/s of the steps after the first
# (from --metrics) and the run's CPU seconds; per round the ratios beside
# the targets (flash / naive >= 1.3x at T = 2048 and >= 0.95x at T = 256;
# bf16 flash / fp32 flash >= 1.5x at T = 2048, on a CPU with avx512_bf16 or
# AMX). On a machine others load, wall tokens/s swing with the load; the
# CPU-second ratios are printed beside them for that case.
# Usage:
#   bash scripts/bench-flash.sh BUILD [ROUNDS] [STEPS]
# BUILD holds tools/fsc-train; ROUNDS defaults to 2, STEPS to 3 (at least
# 2). The metrics files go to $OUT (default: a fresh temporary folder).
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
bin=$(readlink -f "$1")/tools/fsc-train
rounds=${2:-2}
steps=${3:-3}
[ -x "$bin" ] || { echo "bench-flash.sh: $bin: no such program" >&2; exit 2; }
[ "$steps" -ge 2 ] || { echo "bench-flash.sh: STEPS must be at least 2" >&2; exit 2; }
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
echo "bench-flash.sh: metrics in $out; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"

# run NAME T B ARGS...: prints "NAME tokens/s cpu_s" and sets tps / cpu.
run() {
  local name=$1 T=$2 B=$3 m="$out/${1}_r$r.jsonl" t
  shift 3
  t=$( { /usr/bin/time -f "%U %S" "$bin" --layers 8 --d-model 512 --heads 8 --vocab 8192 \
    --seq "$T" --batch "$B" --steps "$steps" --threads 1 --quiet --metrics "$m" "$@" \
    >/dev/null; } 2>&1 | tail -1)
  cpu=$(awk '{print $1 + $2}' <<<"$t")
  tps=$(python3 -c 'import json,sys
v=[json.loads(l)["tokens_per_s"] for l in open(sys.argv[1]) if l.strip()][1:]
print("%.1f" % (sum(v) / len(v)))' "$m")
  printf '  %-22s %8s tokens/s %8.1f CPU s\n' "$name" "$tps" "$cpu"
}

ratio() { python3 -c 'import sys; print("%.2fx" % (float(sys.argv[1]) / float(sys.argv[2])))' "$@"; }

for r in $(seq 1 "$rounds"); do
  echo "round $r (load $(cut -d' ' -f1 /proc/loadavg))"
  run naive_2048 2048 1 --attention naive; n2=$tps nc2=$cpu
  run flash_2048 2048 1 --attention flash; f2=$tps fc2=$cpu
  run flash_bf16_2048 2048 1 --attention flash --mixed-precision bf16; b2=$tps bc2=$cpu
  run naive_256 256 4 --attention naive; n1=$tps nc1=$cpu
  run flash_256 256 4 --attention flash; f1=$tps fc1=$cpu
  echo "  T=2048 flash/naive $(ratio "$f2" "$n2") (CPU $(ratio "$nc2" "$fc2"); target >= 1.3x)"
  echo "  T=256  flash/naive $(ratio "$f1" "$n1") (CPU $(ratio "$nc1" "$fc1"); target >= 0.95x)"
  echo "  T=2048 bf16 flash/fp32 flash $(ratio "$b2" "$f2") (CPU $(ratio "$fc2" "$bc2");" \
    "target >= 1.5x)"
done
