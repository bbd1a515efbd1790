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
# both builds run the same kernels.
set -euo pipefail
me=bench-ab.sh
[ $# -ge 2 ] || { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
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

one() { # program case -> tokens/s
  local flags launch=()
  flags=$(args_of "$2")
  [ "$2" = single ] || launch=(mpiexec -n 2)
  # shellcheck disable=SC2086
  "${launch[@]}" "$1" --config medium $flags --warmup 1 ${extra[@]+"${extra[@]}"} 2>/dev/null |
    python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["tokens_per_s"])'
}

echo "A: $a"
echo "B: $b"
echo "kernels: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset (OpenBLAS detects)}; load: $(cut -d' ' -f1-3 /proc/loadavg)"
for c in "${cases[@]}"; do
  fa=(); fb=()
  for r in $(seq "$rounds"); do
    fa+=("$(one "$a" "$c")")
    fb+=("$(one "$b" "$c")")
    echo "$c round $r: A ${fa[-1]}  B ${fb[-1]} tokens/s"
  done
  python3 - "$c" "${fa[*]}" "${fb[*]}" <<'PY'
import statistics, sys
c, fa, fb = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
r = [y / x for x, y in zip(fa, fb)]
print(f"== {c}: B/A per round {' '.join(f'{x:.3f}' for x in r)}; median {statistics.median(r):.3f} "
      f"(A {statistics.median(fa):.0f}, B {statistics.median(fb):.0f} tokens/s)")
PY
done
