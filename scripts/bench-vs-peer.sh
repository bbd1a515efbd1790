#!/usr/bin/env bash
# fsc-bench beside PyTorch (../shared/peer/bench_peer.py), alternating the two
# programs ROUNDS times per config so that both see the same machine; prints
# each JSON line and the ratio of the medians. Usage:
#   bash scripts/bench-vs-peer.sh [small|medium|all] [ROUNDS] [single|ddp|oss|sdp|fsdp] [RANKS]
# ddp, sdp and fsdp run fsc under mpiexec against the peer's torch DDP, oss against ZeroRedundancyOptimizer+DDP
# (gloo), RANKS ranks each.
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-all}
rounds=${2:-3}
strategy=${3:-single}
ranks=${4:-2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
peer=${PEER:-../shared/peer/bench_peer.py}
[ -x build/tools/fsc-bench ] || bash scripts/build.sh
configs=(small medium)
[ "$which" != all ] && configs=("$which")
for c in "${configs[@]}"; do
  case $c in
    small)  args=(--layers 4 --d-model 256 --heads 4 --seq 128 --vocab 512 --batch 8); steps=20 ;;
    medium) args=(--layers 8 --d-model 512 --heads 8 --seq 256 --vocab 8192 --batch 4); steps=10 ;;
    *) echo "unknown config $c" >&2; exit 2 ;;
  esac
  fsc=(); torch=(); share=()
  for r in $(seq "$rounds"); do
    if [ "$strategy" != single ]; then
      line=$(mpiexec -n "$ranks" build/tools/fsc-bench --strategy "$strategy" --config "$c" --steps "$steps")
    else
      line=$(build/tools/fsc-bench --config "$c" --steps "$steps")
    fi
    echo "fsc   $line"
    fsc+=("$(echo "$line" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])')")
    share+=("$(echo "$line" | python3 -c 'import json,sys; print(json.load(sys.stdin)["share_of_peak"])')")
    peer_args=(--strategy single)
    case $strategy in ddp|sdp|fsdp) peer_args=(--strategy ddp --world "$ranks") ;; esac
    [ "$strategy" = oss ] && peer_args=(--strategy zero1_torch --world "$ranks")
    line=$(/usr/bin/python3 "$peer" "${peer_args[@]}" "${args[@]}" --steps "$steps" --warmup-steps 3 2>/dev/null | tail -1)
    echo "torch $line" | cut -c1-400
    torch+=("$(echo "$line" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_sec"])')")
  done
  python3 - "$c" "${fsc[*]}" "${torch[*]}" "${share[*]}" "$strategy" <<'PY'
import statistics, sys
c, f, t, s = sys.argv[1], *[list(map(float, a.split())) for a in sys.argv[2:5]]
ratios = [a / b for a, b in zip(f, t)]
print(f"== {c} {sys.argv[5]}: fsc {statistics.median(f):.0f} tokens/s (share of sgemm peak {statistics.median(s):.3f}), "
      f"PyTorch {statistics.median(t):.0f} tokens/s; per-round ratios {' '.join(f'{r:.2f}' for r in ratios)}, "
      f"median {statistics.median(ratios):.2f}x")
PY
done
