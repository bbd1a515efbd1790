#!/usr/bin/env bash
# fsc-bench beside its PyTorch peer (scripts/peer_bench.py), alternating the
# two programs ROUNDS times per config so that both see the same machine; prints
# each JSON line and the ratio of the medians. Both run the same OpenBLAS
# kernels: fsc's CPUID choice unless --coretype says otherwise, so neither side
# is handicapped by the environment's OPENBLAS_CORETYPE. Usage:
#   bash scripts/bench-vs-peer.sh [--coretype NAME] [--bf16] [--arch gpt2|llama] [--fairscale]
#                                 [--peer PATH] [--build DIR] [--steps N] [--warmup N]
#                                 [small|medium|all] [ROUNDS] [single|ddp|oss|sdp|fsdp|pp] [RANKS]
# The peer of each strategy: single -> one torch process; ddp -> torch DDP;
# oss -> torch ZeroRedundancyOptimizer + DDP; sdp, fsdp -> torch DDP; pp (fsc's
# 1F1B, RANKS stages, 8 micro-batches of the config's batch) -> FairScale's Pipe.
# Distributed peers run over gloo on 127.0.0.1, RANKS ranks each.
#   --coretype NAME  OPENBLAS_CORETYPE for both sides (or FSC_BENCH_CORETYPE=NAME);
#                    default: the kernels fsc picks from CPUID (fsc-bench --blas-info)
#   --bf16           fsc --mixed-precision bf16 against the peer's --autocast bf16
#   --arch llama     both sides train the LLaMA of the same sizes (fsc-bench --arch llama)
#   --fairscale      oss, sdp, fsdp against FairScale's OSS + DDP, OSS + ShardedDDP,
#                    FSDP (needs `import fairscale`; pp always does)
#   --peer PATH      another peer script with peer_bench.py's flags (or FSC_PEER=PATH)
#   --build DIR      the build whose tools/fsc-bench runs (or FSC_BUILD_DIR=DIR; default build)
#   --steps N, --warmup N  timed and untimed steps of both sides (default: small 20, medium
#                    10; warm-up 3)
# One process on one thread: each side also reports tokens per second of its own
# CPU time, and the ratio of those is printed too (a shared machine's other
# load stretches the wall clock far more than a process's CPU time).
# A peer that cannot run here (torch or FairScale missing: exit 77) is reported
# as skipped and fsc's figures are printed alone.
set -euo pipefail
me=bench-vs-peer.sh
coretype=${FSC_BENCH_CORETYPE:-}
peer=${FSC_PEER:-}
build=${FSC_BUILD_DIR:-build}
arch=gpt2
steps_given=
warmup=3
bf16=0
fairscale=0
pos=()
while [ $# -gt 0 ]; do
  case $1 in
    --coretype|--peer|--arch|--build|--steps|--warmup)
      [ $# -ge 2 ] || { echo "$me: $1 needs a value" >&2; exit 2; }
      case $1 in
        --coretype) coretype=$2 ;; --peer) peer=$2 ;; --arch) arch=$2 ;; --build) build=$2 ;;
        --steps) steps_given=$2 ;; --warmup) warmup=$2 ;;
      esac
      shift 2 ;;
    --coretype=*) coretype=${1#*=}; shift ;;
    --peer=*) peer=${1#*=}; shift ;;
    --arch=*) arch=${1#*=}; shift ;;
    --build=*) build=${1#*=}; shift ;;
    --bf16) bf16=1; shift ;;
    --fairscale) fairscale=1; shift ;;
    -h|--help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "$me: unknown flag $1 (see --help)" >&2; exit 2 ;;
    *) pos+=("$1"); shift ;;
  esac
done
set -- ${pos[@]+"${pos[@]}"}
case $arch in gpt2|llama) ;; *) echo "$me: --arch $arch: expected gpt2 or llama" >&2; exit 2 ;; esac
for n in "$steps_given" "$warmup"; do
  [[ -z $n || $n =~ ^[0-9]+$ ]] || { echo "$me: --steps and --warmup take a count, not $n" >&2; exit 2; }
done
[ "${steps_given:-1}" -ge 1 ] || { echo "$me: --steps must be >= 1" >&2; exit 2; }

# Resolve a given peer before leaving the caller's directory: relative paths are theirs.
script_root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
peer=${peer:-$script_root/scripts/peer_bench.py}
[ -f "$peer" ] || { echo "$me: peer script $peer (--peer / FSC_PEER): no such file" >&2; exit 2; }
peer=$(readlink -f "$peer")
[ -d "$build" ] && build=$(readlink -f "$build")
cd "$script_root"
bench=$build/tools/fsc-bench

which=${1:-all}
rounds=${2:-3}
strategy=${3:-single}
ranks=${4:-2}
case $strategy in single|ddp|oss|sdp|fsdp|pp) ;; *) echo "$me: unknown strategy $strategy" >&2; exit 2 ;; esac
# Debian's interpreter has python3-torch; another python3 may come first on PATH.
py=/usr/bin/python3
[ -x "$py" ] || py=python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ ! -x "$bench" ]; then
  [ "$build" = "$script_root/build" ] || [ "$build" = build ] ||
    { echo "$me: $bench: no such program (--build / FSC_BUILD_DIR)" >&2; exit 2; }
  bash scripts/build.sh
fi
field() { python3 -c 'import json,sys; print(json.load(sys.stdin).get(sys.argv[1], ""))' "$1"; }
if ! cpu_info=$(env -u OPENBLAS_CORETYPE "$bench" --blas-info); then
  echo "$me: $bench --blas-info failed; rebuild it (bash scripts/build.sh)" >&2
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
echo "fsc:     $("$bench" --blas-info | field blas)"
echo "peer:    $py $peer --openblas-coretype $coretype"

# fsc's flags and the peer's for the chosen strategy
fsc_args=(--strategy "$strategy")
peer_args=(--strategy single)
case $strategy in
  ddp) peer_args=(--strategy ddp --ranks "$ranks") ;;
  oss) peer_args=(--strategy zero1 --ranks "$ranks") ;;
  sdp|fsdp) peer_args=(--strategy ddp --ranks "$ranks") ;;
  pp) fsc_args=(--strategy ddp --pp "$ranks" --chunks 8 --pipe-schedule 1f1b)
      peer_args=(--strategy fairscale-pipe --ranks "$ranks" --chunks 8) ;;
esac
if [ "$fairscale" = 1 ] && [ "$strategy" != pp ]; then
  case $strategy in
    oss|sdp|fsdp) peer_args=(--strategy "fairscale-$strategy" --ranks "$ranks") ;;
    *) echo "$me: --fairscale: FairScale has no peer of its own for $strategy; using ${peer_args[*]}" >&2 ;;
  esac
fi
fsc_args+=(--arch "$arch"); peer_args+=(--arch "$arch")
if [ "$bf16" = 1 ]; then fsc_args+=(--mixed-precision bf16); peer_args+=(--autocast bf16); fi

configs=(small medium)
[ "$which" != all ] && configs=("$which")
peer_err=$(mktemp)
trap 'rm -f "$peer_err"' EXIT
for c in "${configs[@]}"; do
  case $c in
    small) steps=20 ;;
    medium) steps=10 ;;
    *) echo "unknown config $c" >&2; exit 2 ;;
  esac
  steps=${steps_given:-$steps}
  fsc=(); torch=(); share=(); fsc_cpu=(); torch_cpu=()
  for r in $(seq "$rounds"); do
    if [ "$strategy" != single ]; then
      line=$(mpiexec -n "$ranks" "$bench" "${fsc_args[@]}" --config "$c" --steps "$steps" \
             --warmup "$warmup")
    else
      line=$("$bench" "${fsc_args[@]}" --config "$c" --steps "$steps" \
             --warmup "$warmup")
    fi
    echo "fsc   $line" | cut -c1-600
    fsc+=("$(field tokens_per_s <<<"$line")")
    share+=("$(field share_of_peak <<<"$line")")
    fsc_cpu+=("$(field cpu_tokens_per_s <<<"$line")")
    rc=0
    line=$("$py" "$peer" "${peer_args[@]}" --config "$c" --steps "$steps" --warmup "$warmup" \
             --openblas-coretype "$coretype" 2>"$peer_err" | tail -1) || rc=$?
    if [ "$rc" = 77 ]; then
      echo "peer  skipped: $(grep 'skipped' "$peer_err" | tail -1)"
      continue
    fi
    if [ "$rc" != 0 ] || [ -z "$line" ]; then
      echo "$me: the peer failed:" >&2; tail -20 "$peer_err" >&2; exit 1
    fi
    echo "torch $line" | cut -c1-400
    echo "torch kernels: $(field openblas_kernels <<<"$line")"
    torch+=("$(field tokens_per_s <<<"$line")")
    torch_cpu+=("$(field cpu_tokens_per_s <<<"$line")")
  done
  python3 - "$c $arch" "${fsc[*]}" "${torch[*]}" "${share[*]}" "$strategy" "${fsc_cpu[*]}" \
    "${torch_cpu[*]}" <<'PY'
import statistics, sys
c, f, t, s = sys.argv[1], *[list(map(float, a.split())) for a in sys.argv[2:5]]
fc, tc = [list(map(float, a.split())) for a in sys.argv[6:8]]
head = (f"== {c} {sys.argv[5]}: fsc {statistics.median(f):.0f} tokens/s "
        f"(share of sgemm peak {statistics.median(s):.3f})")
if not t:
    print(head + "; no peer figure (skipped)")
    sys.exit(0)
ratios = [a / b for a, b in zip(f, t)]
print(f"{head}, peer {statistics.median(t):.0f} tokens/s; per-round ratios "
      f"{' '.join(f'{r:.2f}' for r in ratios)}, median {statistics.median(ratios):.2f}x")
if fc and len(fc) == len(tc):  # one thread each: per CPU-second, which other load stretches less
    ratios = [a / b for a, b in zip(fc, tc)]
    print(f"   per CPU-second: fsc {statistics.median(fc):.0f}, peer {statistics.median(tc):.0f} tokens/s; "
          f"per-round ratios {' '.join(f'{r:.2f}' for r in ratios)}, median {statistics.median(ratios):.2f}x")
PY
done
