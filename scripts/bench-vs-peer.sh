#!/usr/bin/env bash
# fsc-bench beside PyTorch (bench_peer.py, from ../shared/peer), alternating the
# two programs ROUNDS times per config so that both see the same machine; prints
# each JSON line and the ratio of the medians. Both run the same OpenBLAS
# kernels: fsc's CPUID choice unless --coretype says otherwise, so neither side
# is handicapped by the environment's OPENBLAS_CORETYPE. Usage:
#   bash scripts/bench-vs-peer.sh [--coretype NAME] [--peer PATH]
#                                 [small|medium|all] [ROUNDS] [single|ddp|oss|sdp|fsdp] [RANKS]
# ddp, sdp and fsdp run fsc under mpiexec against the peer's torch DDP, oss against ZeroRedundancyOptimizer+DDP
# (gloo), RANKS ranks each.
#   --coretype NAME  OPENBLAS_CORETYPE for both sides (or FSC_BENCH_CORETYPE=NAME);
#                    default: the kernels fsc picks from CPUID (fsc-bench --blas-info)
#   --peer PATH      the peer's bench_peer.py (or FSC_PEER=PATH); default:
#                    ../shared/peer/bench_peer.py beside the repository the command
#                    runs in, then beside the checkout this script belongs to
set -euo pipefail
me=bench-vs-peer.sh
coretype=${FSC_BENCH_CORETYPE:-}
peer=${FSC_PEER:-${PEER:-}} # PEER: the name this script read before FSC_PEER
pos=()
while [ $# -gt 0 ]; do
  case $1 in
    --coretype|--peer)
      [ $# -ge 2 ] || { echo "$me: $1 needs a value" >&2; exit 2; }
      if [ "$1" = --coretype ]; then coretype=$2; else peer=$2; fi
      shift 2 ;;
    --coretype=*) coretype=${1#*=}; shift ;;
    --peer=*) peer=${1#*=}; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "$me: unknown flag $1 (see --help)" >&2; exit 2 ;;
    *) pos+=("$1"); shift ;;
  esac
done
set -- ${pos[@]+"${pos[@]}"}

# Find the peer before leaving the caller's directory: relative paths are theirs.
script_root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
if [ -n "$peer" ]; then
  [ -f "$peer" ] || { echo "$me: peer script $peer (--peer / FSC_PEER): no such file" >&2; exit 2; }
else
  tried=()
  for root in "$(git rev-parse --show-toplevel 2>/dev/null || true)" "$script_root"; do
    [ -n "$root" ] || continue
    tried+=("$root/../shared/peer/bench_peer.py")
    if [ -f "$root/../shared/peer/bench_peer.py" ]; then peer=$root/../shared/peer/bench_peer.py; break; fi
  done
  if [ -z "$peer" ]; then
    echo "$me: cannot find the PyTorch peer bench_peer.py (looked at: ${tried[*]});" \
         "pass --peer PATH or set FSC_PEER=PATH" >&2
    exit 2
  fi
fi
peer=$(readlink -f "$peer")
cd "$script_root"

which=${1:-all}
rounds=${2:-3}
strategy=${3:-single}
ranks=${4:-2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -x build/tools/fsc-bench ] || bash scripts/build.sh
field() { python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }
if ! cpu_info=$(env -u OPENBLAS_CORETYPE build/tools/fsc-bench --blas-info); then
  echo "$me: build/tools/fsc-bench --blas-info failed; rebuild it (bash scripts/build.sh)" >&2
  exit 2
fi
how="given by --coretype / FSC_BENCH_CORETYPE"
if [ -z "$coretype" ]; then
  coretype=$(field corename <<<"$cpu_info")
  how="fsc's CPUID choice"
fi
if [ -n "${OPENBLAS_CORETYPE:-}" ] && [ "$OPENBLAS_CORETYPE" != "$coretype" ]; then
  how="$how; the environment's OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE is overridden for both"
fi
export OPENBLAS_CORETYPE=$coretype # fsc, and its ranks under mpiexec
echo "kernels: OPENBLAS_CORETYPE=$coretype for both sides ($how)"
echo "fsc:     $(build/tools/fsc-bench --blas-info | field blas)"
echo "peer:    /usr/bin/python3 $peer --openblas-coretype $coretype"

configs=(small medium)
[ "$which" != all ] && configs=("$which")
peer_err=$(mktemp)
trap 'rm -f "$peer_err"' EXIT
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
    fsc+=("$(field tokens_per_s <<<"$line")")
    share+=("$(field share_of_peak <<<"$line")")
    peer_args=(--strategy single)
    case $strategy in ddp|sdp|fsdp) peer_args=(--strategy ddp --world "$ranks") ;; esac
    [ "$strategy" = oss ] && peer_args=(--strategy zero1_torch --world "$ranks")
    if ! line=$(/usr/bin/python3 "$peer" "${peer_args[@]}" "${args[@]}" --steps "$steps" --warmup-steps 3 \
                  --openblas-coretype "$coretype" 2>"$peer_err" | tail -1) || [ -z "$line" ]; then
      echo "$me: the peer failed:" >&2; tail -20 "$peer_err" >&2; exit 1
    fi
    echo "torch $line" | cut -c1-400
    # the kernels the peer's OpenBLAS reports it ran, beside fsc's "blas" field above
    echo "torch kernels: $(python3 -c 'import json,sys; print(json.load(sys.stdin)["openblas"].get("corename", "unknown"))' <<<"$line")"
    torch+=("$(field tokens_per_sec <<<"$line")")
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
