#!/usr/bin/env bash
# Step-time cost of checkpointing: no save, --save-every N synchronous, and
# --async-save, alternated in rounds (so a loaded machine's drift hits all
# three alike), 2 ranks.
#
# usage: scripts/bench-async-save.sh BUILD STRATEGY [SIZE [ROUNDS [STEPS [EVERY]]]]
#   BUILD     a build directory holding tools/fsc-train
#   STRATEGY  ddp, fsdp, ... (fsc-train --strategy)
#   SIZE      medium (L8 C512 H8 T256 V8192, batch 4 per rank; the default) or
#             small (L4 C256 H4 T128 V512, batch 8)
#   ROUNDS    rounds of the three runs (default 2); STEPS per run (default 20);
#             EVERY: --save-every (default 10)
# Per run: the mean step interval over steps 2..STEPS-1 from --metrics'
# elapsed_s, which takes in the save at step EVERY (synchronous: its whole
# write; asynchronous: the staging copy and the background write beside the
# following steps) and leaves out start-up and the last step's save. Prints
# each run's ms/step and, per round, sync/none and async/none, then the
# medians of those ratios over the rounds.
set -euo pipefail
build=${1:?usage: $0 BUILD STRATEGY [SIZE [ROUNDS [STEPS [EVERY]]]]}
strategy=${2:?strategy}
size=${3:-medium}
rounds=${4:-2}
steps=${5:-20}
every=${6:-10}
case $size in
  medium) model=(--layers 8 --d-model 512 --heads 8 --seq 256 --vocab 8192 --batch 4) ;;
  small) model=(--layers 4 --d-model 256 --heads 4 --seq 128 --vocab 512 --batch 8) ;;
  *) echo "size: medium or small" >&2; exit 2 ;;
esac
bin=$build/tools/fsc-train
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() { # mode -> ms per step
  local mode=$1 flags=()
  rm -rf "$work/ck" "$work/m.jsonl"
  case $mode in
    sync) flags=(--checkpoint-dir "$work/ck" --save-every "$every") ;;
    async) flags=(--checkpoint-dir "$work/ck" --save-every "$every" --async-save) ;;
  esac
  mpiexec -n 2 --oversubscribe "$bin" "${model[@]}" --strategy "$strategy" --steps "$steps" \
    --quiet --metrics "$work/m.jsonl" "${flags[@]}" >/dev/null
  python3 - "$work/m.jsonl" "$steps" <<'EOF'
import json, sys
rows = {r["step"]: r for r in map(json.loads, open(sys.argv[1]))}
last = int(sys.argv[2]) - 1
print(f"{1000 * (rows[last]['elapsed_s'] - rows[1]['elapsed_s']) / (last - 1):.1f}")
EOF
}
echo "# $strategy, $size, 2 ranks, --steps $steps --save-every $every; load $(cut -d' ' -f1-3 /proc/loadavg)"
ratios=()
for r in $(seq 1 "$rounds"); do
  none=$(run none); sync=$(run sync); async=$(run async)
  python3 -c "n,s,a=$none,$sync,$async; print(f'round $r: none {n} ms/step, sync {s} ({s/n:.3f}x), async {a} ({a/n:.3f}x)')"
  ratios+=("$none,$sync,$async")
done
# the medians over the rounds of each round's ratios (a round's runs share its load)
python3 -c '
import statistics, sys
rows = [tuple(map(float, x.split(","))) for x in sys.argv[1:]]
s, a = (statistics.median(r[k] / r[0] for r in rows) for k in (1, 2))
print(f"median of {len(rows)} rounds: sync {s:.3f}x, async {a:.3f}x of no save")' "${ratios[@]}"
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
