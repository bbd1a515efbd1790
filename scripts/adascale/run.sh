#!/usr/bin/env bash
# AdaScale at 4 ranks against one rank (docs/benchmarks.md, "AdaScale and
# SlowMo"): for each seed, one rank for 800 steps; 4 ranks with --adascale to
# 800 scale-invariant steps; then plain DDP and linear scaling (4x the lr)
# with the one-rank schedule compressed into AdaScale's real-step budget, so
# all three 4-rank runs spend the same number of real steps; and both again
# compressed into 800/4 real steps, the same samples as one rank (the
# baseline of Johnson et al. 2020). Prints the wall time of each run, then
# the tables (table.py) and draws the first seed's picture.
#   scripts/adascale/run.sh [OUTDIR]      (default out/adascale)
# Environment: SEEDS (default "1337 2 3 4 5"), FSC_BUILD (default build),
# LR and MOMENTUM (the SGD regime, default 0.0125 and 0: plain SGD; the
# momentum regime of the docs is LR=0.01 MOMENTUM=0.9 into out/adascale_m09),
# MPIEXEC (default mpiexec), SEQ (sequence length, default 128). The
# one-rank runs go first; pilot.py's rule must pass on all of them before
# any 4-rank run starts. A
# run whose metrics file already holds its last step is not run again, so an
# interrupted sweep picks up where it stopped.
# The 4-rank runs go one at a time with --oversubscribe (they fit 2 cores).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/out/adascale}
mkdir -p "$out" && out=$(cd "$out" && pwd)
seeds=${SEEDS:-1337 2 3 4 5}
build=${FSC_BUILD:-$root/build}
[ -d "$build" ] && build=$(cd "$build" && pwd)
train=$build/tools/fsc-train
mpiexec=${MPIEXEC:-mpiexec}
[ -x "$train" ] || { echo "run.sh: no $train (build first, or set FSC_BUILD)" >&2; exit 2; }
command -v "$mpiexec" >/dev/null || { echo "run.sh: no MPI launcher '$mpiexec' (set MPIEXEC)" >&2; exit 2; }
# Open MPI refuses root without these; harmless for MPICH.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# The regime: plain SGD at batch 1 per rank, where the learning rate sets
# the pace (AdaScale's premise; under momentum 0.9 it barely does, see the
# docs), clipping at 5 (about 3x the median gradient norm, so it cuts only
# the spikes). The held-out set is the same 32 sequences everywhere: 32
# batches of 1 on one rank, 8 of 4 on four.
# A shorter SEQ evaluates proportionally more sequences: the same 4096
# held-out tokens, so the curves are no noisier for it.
warmup=20
seq=${SEQ:-128}
nev=$((32 * 128 / seq))
# linear scaling takes 4 x LR
lr=${LR:-0.0125}
momentum=${MOMENTUM:-0}
lin_lr=$(python3 -c "import sys; print(4 * float(sys.argv[1]))" "$lr")
export LR=$lr  # table.py's labels
common=(--optimizer sgd --momentum "$momentum" --lr "$lr" --clip 5 --batch 1 --warmup "$warmup"
        --seq "$seq" --threads 1 --quiet)
one_eval=(--eval-every 25 --eval-batches "$nev")
four_eval=(--eval-every 20 --eval-batches $((nev / 4)))
steps=800
samples=$((steps / 4))  # real steps of a 4-rank run that sees one rank's samples
sample_eval=(--eval-every 5 --eval-batches $((nev / 4)))

# done_run FILE TARGET: the metrics file ends with an evaluation at step
# TARGET (AdaScale: progress reached TARGET). A budget that changed since
# (AdaScale run again) makes the compressed runs run again too.
done_run() {
  [ -s "$1" ] && python3 - "$1" "$2" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
last = rows[-1] if rows else {}
target = float(sys.argv[2])
ok = "val_loss" in last and (last["progress"] >= target if "progress" in last
                             else last.get("step") == target)
sys.exit(0 if ok else 1)
EOF
}

# run NAME METRICS TARGET CMD...: runs unless done, logs its wall time.
run() {
  local name=$1 metrics=$2 target=$3
  shift 3
  if done_run "$metrics" "$target"; then
    echo "$name: already done ($metrics)" >&2
    return
  fi
  rm -f "$metrics"
  local t0=$SECONDS
  "$@" --metrics "$metrics"
  local dt=$((SECONDS - t0))
  echo "$name: ${dt} s" >&2
  echo "$name $dt" >>"$out/wall_s.txt"
}

for s in $seeds; do
  run "seed $s one rank" "$out/one_$s.jsonl" $steps \
    "$train" "${common[@]}" "${one_eval[@]}" --steps $steps --seed "$s"
done
# shellcheck disable=SC2086
python3 "$root/scripts/adascale/pilot.py" "$out" $seeds ||
  { echo "run.sh: the one-rank pilots fail the rule: no 4-rank run for this regime" >&2; exit 1; }

for s in $seeds; do
  run "seed $s adascale" "$out/ada_$s.jsonl" $steps \
    "$mpiexec" -n 4 --oversubscribe "$train" "${common[@]}" "${four_eval[@]}" \
    --strategy ddp --adascale --steps $steps --seed "$s"
  # AdaScale's real steps are the budget of the compressed runs.
  budget=$(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])['step'])" \
    "$out/ada_$s.jsonl")
  run "seed $s plain ddp ($budget steps)" "$out/ddp_$s.jsonl" "$budget" \
    "$mpiexec" -n 4 --oversubscribe "$train" "${common[@]}" "${four_eval[@]}" \
    --strategy ddp --steps "$budget" --seed "$s"
  run "seed $s linear scaling ($budget steps)" "$out/lin_$s.jsonl" "$budget" \
    "$mpiexec" -n 4 --oversubscribe "$train" "${common[@]}" "${four_eval[@]}" \
    --strategy ddp --steps "$budget" --lr "$lin_lr" --seed "$s"
  # The paper's baseline: the same samples as one rank, so the schedule
  # (warm-up included) compressed 4x into 800/4 real steps; evaluated every
  # 5 real steps, 20 scale-invariant ones, about AdaScale's spacing.
  run "seed $s plain ddp ($samples steps)" "$out/ddp${samples}_$s.jsonl" $samples \
    "$mpiexec" -n 4 --oversubscribe "$train" "${common[@]}" "${sample_eval[@]}" \
    --strategy ddp --steps $samples --warmup $((warmup / 4)) --seed "$s"
  run "seed $s linear scaling ($samples steps)" "$out/lin${samples}_$s.jsonl" $samples \
    "$mpiexec" -n 4 --oversubscribe "$train" "${common[@]}" "${sample_eval[@]}" \
    --strategy ddp --steps $samples --warmup $((warmup / 4)) --lr "$lin_lr" --seed "$s"
done

# shellcheck disable=SC2086
python3 "$root/scripts/adascale/table.py" "$out" $seeds
first=${seeds%% *}
if [ -x "$build/tools/fsc-plot" ]; then
  # From inside the folder, so the legend names the runs, not the paths.
  # shellcheck disable=SC2035
  (cd "$out/plot_$first" && "$build/tools/fsc-plot" *.jsonl -o "$out/adascale_seed$first.svg" \
    --title "AdaScale vs plain DDP and linear scaling (SGD momentum $momentum, lr $lr, batch 1, seq $seq, clip 5, seed $first)")
  echo "picture: $out/adascale_seed$first.svg" >&2
fi
