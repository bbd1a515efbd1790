#!/usr/bin/env bash
# Two builds of fsc-bench, A and B (before and after a change), alternated
# A B A B ... ROUNDS times per case in one run, so both see the same machine;
# prints every tokens/s and, per case, B/A of each round with the median.
# Usage:
#   bash scripts/bench-ab.sh A_BUILD B_BUILD [ROUNDS] [CASE ...]
# A_BUILD and B_BUILD are build directories holding tools/fsc-bench (for an
# old commit: git archive COMMIT | tar -x -C DIR; cmake -S DIR -B DIR/b
# -DCMAKE_BUILD_TYPE=Release; cmake --build DIR/b --target fsc-bench).
# CASE is one of (default: all five, on the medium config):
#   single  one process                                  (--steps 4)
#   ddp     mpiexec -n 2, --strategy ddp                 (--steps 3)
#   fsdp    mpiexec -n 2, --strategy fsdp                (--steps 3)
#   pp      mpiexec -n 2, ddp --pp 2, 1F1B, 4 micro-batches (--steps 3)
#   tp      mpiexec -n 2, ddp --tp 2                     (--steps 3)
# every run with --warmup 1. FSC_BENCH_ARGS adds flags to every run (for
# example --mixed-precision bf16). OPENBLAS_CORETYPE is the environment's:
# both builds run the same kernels. Where `perf stat` works, each run also
# counts the CPU time (and, where the CPU exposes them, the user-space
# instructions) of every process it starts: the whole run (start-up, warm-up
# and timed steps, the same work in both builds), which a shared machine's
# other load stretches far less than the wall clock (under MPI they include
# the ranks' polling while they wait).
set -euo pipefail
me=bench-ab.sh
[ $# -ge 2 ] || { sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
a=$(readlink -f "$1")/tools/fsc-bench
b=$(readlink -f "$2")/tools/fsc-bench
rounds=${3:-2}
shift $(($# < 3 ? $# : 3))
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(single ddp fsdp pp tp)
for p in "$a" "$b"; do [ -x "$p" ] || { echo "$me: $p: no such program" >&2; exit 2; }; done
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "$me: ROUNDS must be a positive count" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
extra=(${FSC_BENCH_ARGS:-})

args_of() { # the fsc-bench flags of a case
  case $1 in
    single) echo "--strategy single --steps 4" ;;
    ddp) echo "--strategy ddp --steps 3" ;;
    fsdp) echo "--strategy fsdp --steps 3" ;;
    pp) echo "--strategy ddp --pp 2 --chunks 4 --pipe-schedule 1f1b --steps 3" ;;
    tp) echo "--strategy ddp --tp 2 --steps 3" ;;
    *) echo "$me: unknown case $1 (single, ddp, fsdp, pp, tp)" >&2; return 2 ;;
  esac
}
for c in "${cases[@]}"; do args_of "$c" >/dev/null; done

stat=$(mktemp)
trap 'rm -f "$stat"' EXIT
counting=()
perf stat -x, -o "$stat" -e task-clock,instructions:u true 2>/dev/null &&
  grep -q task-clock "$stat" && counting=(perf stat -x, -o "$stat" -e task-clock,instructions:u --)

one() { # program case -> "tokens/s CPU-ms instructions" (the last two 0 without perf)
  local flags launch=() tok
  flags=$(args_of "$2")
  [ "$2" = single ] || launch=(mpiexec -n 2)
  : >"$stat"
  # shellcheck disable=SC2086
  tok=$(${counting[@]+"${counting[@]}"} "${launch[@]}" "$1" --config medium $flags --warmup 1 \
          ${extra[@]+"${extra[@]}"} 2>/dev/null |
        python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["tokens_per_s"])')
  python3 - "$tok" "$stat" <<'PY'
import sys
got = {}
for line in open(sys.argv[2]):
    f = line.strip().split(",")
    if len(f) > 2 and f[0].replace(".", "", 1).isdigit():
        got[f[2].split(":")[0]] = float(f[0])
print(sys.argv[1], got.get("task-clock", 0), got.get("instructions", 0))
PY
}

echo "A: $a"
echo "B: $b"
echo "kernels: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset (OpenBLAS detects)}; load: $(cut -d' ' -f1-3 /proc/loadavg)"
[ ${#counting[@]} -gt 0 ] || echo "(perf stat unavailable: tokens/s only)"
for c in "${cases[@]}"; do
  fa=(); fb=()
  for r in $(seq "$rounds"); do
    fa+=("$(one "$a" "$c")")
    fb+=("$(one "$b" "$c")")
    echo "$c round $r: A ${fa[-1]}  B ${fb[-1]} (tokens/s, CPU ms, user instructions)"
  done
  python3 - "$c" "$(printf '%s;' "${fa[@]}")" "$(printf '%s;' "${fb[@]}")" <<'PY'
import statistics, sys
c = sys.argv[1]
fa, fb = [[list(map(float, r.split())) for r in a.split(";") if r] for a in sys.argv[2:4]]
for i, what in enumerate(("tokens/s", "CPU time", "user instructions")):
    r = [y[i] / x[i] for x, y in zip(fa, fb) if x[i] > 0]
    if r:
        print(f"== {c}: {what} B/A per round {' '.join(f'{x:.3f}' for x in r)}; median "
              f"{statistics.median(r):.3f}" + (f" (A {statistics.median(x[0] for x in fa):.0f}, "
                                               f"B {statistics.median(x[0] for x in fb):.0f})" if i == 0 else ""))
PY
done
