#!/usr/bin/env bash
# Context parallelism against one process (issue 26, item 2): fsc-train on
# the same model and sequence length, one process and `mpiexec -n 2 ...
# --strategy ddp --cp 2`, alternated ROUNDS times in one run so both see the
# same machine. Every process runs one thread (--threads 1), so the two
# ranks use two cores where the one process uses one. Per run it prints the
# last step's tokens/s (the first step pays the start-up), the peak of the
# allocator's activation tag on rank 0 (activ, MiB) and, under --cp, rank
# 0's time waiting on the ring's K/V messages after its own tiles were done
# and the time in the attention tiles (fsc-train's `cp ring` line); then the
# ratio of each round (cp 2 / one process) for tokens/s and activation bytes,
# and for the CPU seconds the whole run took (user + system of every
# process, start-up included, from /usr/bin/time): on a machine others load,
# two processes get more of the cores than one, so the wall-clock ratio
# overstates the gain; CPU seconds per run (1.0: the same work) do not.
# Usage:
#   bash scripts/bench-cp.sh BUILD [ROUNDS] [STEPS]
# BUILD holds tools/fsc-train. The model is the medium width at T = 8192
# (--layers 8 --d-model 512 --heads 8 --vocab 8192 --seq 8192, batch 1);
# FSC_CP_MODEL replaces those flags (e.g. "--layers 2 --d-model 256
# --heads 4 --vocab 8192 --seq 2048" for a quick look).
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
bin=$(readlink -f "$1")/tools/fsc-train
rounds=${2:-2}
steps=${3:-2}
[ -x "$bin" ] || { echo "bench-cp.sh: $bin: no such program" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
model=(${FSC_CP_MODEL:---layers 8 --d-model 512 --heads 8 --vocab 8192 --seq 8192})
common=(--data builtin --batch 1 --steps "$steps" --threads 1 --lr 1e-4 --log-every 1 "${model[@]}")

# "tokens/s activ_MiB wait_s tiles_s cpu_s" of one run
measure() {
  /usr/bin/time -f "cpu %U %S" "$@" 2>&1 | awk '
    /^step / { for (i = 1; i < NF; i++) if ($(i + 1) == "tok/s") tps = $i }
    /^peak memory/ && !seen { if (match($0, /activ [0-9.]+ MiB/)) { split(substr($0, RSTART, RLENGTH), f, " "); act = f[2] } seen = 1 }
    /^cp ring/ { w = $5; c = $11 }
    /^cpu / { cpu = $2 + $3 }
    END { printf "%s %s %s %s %s\n", tps, act, (w == "" ? "-" : w), (c == "" ? "-" : c), cpu }'
}

echo "fsc-train ${model[*]}, batch 1, $steps steps, --threads 1; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$rounds"); do
  read -r s_tps s_act _ _ s_cpu < <(measure "$bin" "${common[@]}")
  read -r c_tps c_act c_wait c_tiles c_cpu < <(measure mpiexec -n 2 --oversubscribe "$bin" "${common[@]}" --strategy ddp --cp 2)
  awk -v r="$r" -v st="$s_tps" -v sa="$s_act" -v ct="$c_tps" -v ca="$c_act" -v w="$c_wait" -v c="$c_tiles" -v sc="$s_cpu" -v cc="$c_cpu" 'BEGIN {
    printf "round %d: one process %.0f tok/s, activ %.1f MiB, %.1f CPU s | cp 2 %.0f tok/s, activ %.1f MiB per rank, %.1f CPU s, ring wait %s s, tiles %s s (rank 0) | speed %.2fx, activations %.2fx, CPU seconds %.2fx\n",
      r, st, sa, sc, ct, ca, cc, w, c, (st > 0 ? ct / st : 0), (sa > 0 ? ca / sa : 0), (sc > 0 ? cc / sc : 0) }'
done
