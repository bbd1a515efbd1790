#!/usr/bin/env bash
# Portability matrix of the numerics tests (issue 23). Not part of CI: it runs
# the ctest label `numerics` (2-4 minutes on 2 cores) once per cell, so the
# default pairwise matrix takes about 40 minutes. Factors:
#   build     release (build/) and asan (build-sanitize/: Debug + ASan + UBSan),
#             each built as scripts/test.sh builds it if it is missing
#   blas      OPENBLAS_CORETYPE = Haswell, SkylakeX, Cooperlake, the newest name
#             the loaded OpenBLAS knows (read from the library's core-name
#             table) when that is another, and cpuid (unset: fsc's own choice).
#             Debian's 0.3.21 knows Cooperlake last but refuses to be forced
#             to it ("Core not found"); the table's notes say so, and the
#             corename column shows what OpenBLAS then chose itself.
#   glibc     GLIBC_TUNABLES: default (unset); no-avx512 (AVX-512 masked);
#             no-avx2-fma (an AVX-only CPU: AVX2, FMA and AVX-512 masked).
#             Only glibc sees the mask (libm and string-function variants, the
#             glibc-hwcaps level); OpenBLAS and fsc do their own CPUID.
#   l2        OPENBLAS_L2_SIZE unset and 512
#   threads   OMP_NUM_THREADS = FSC_NUM_THREADS = 1 and 2 (fsc sets OpenMP's
#             count from FSC_NUM_THREADS, default 1, so OMP_NUM_THREADS alone
#             would change nothing; BLAS stays at fsc's 1 thread)
# By default the cells form a pairwise covering array (every pair of values of
# any two factors appears in some cell; the script checks and says so);
# --full runs the whole cross product. Before each cell two probes run under
# the cell's environment: fsc-bench --blas-info (the corename OpenBLAS really
# loaded) plus one training step (the kernels really run: a cell whose probe
# dies of a signal, e.g. SIGILL for kernels the CPU lacks, is reported "not
# runnable" and does not fail the run), and ld.so --list-diagnostics plus the
# addresses libm/libc resolve (the glibc mask took effect).
#
# usage: bash scripts/portability.sh [--full] [--cells LIST] [--dry-run]
#          [--probes-only] [--no-build] [--log-dir DIR] [--] [ctest args...]
#   --cells 1,4-6   run only these cells of the matrix (numbers as --dry-run shows)
#   --dry-run       print the matrix and the environment of each cell; run nothing
#   --probes-only   build, run the probes of each cell, print the table; no ctest
#   --no-build      use build/ and build-sanitize/ as they are (default: an
#                   incremental build, as scripts/test.sh does)
#   --log-dir DIR   where the logs go
#   other arguments go to every ctest run (e.g. -R golden)
# Logs: one per cell (ctest -V) in a new directory under $TMPDIR, or --log-dir.
# Exit status: 1 if any runnable cell failed; 2 if --no-build finds no build.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=pairwise dry=0 probes_only=0 do_build=1 cells="" log_dir=""
ctest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --full) mode=full ;;
    --cells) cells=${2:?--cells needs a list}; shift ;;
    --cells=*) cells=${1#--cells=} ;;
    --dry-run) dry=1 ;;
    --probes-only) probes_only=1 ;;
    --no-build) do_build=0 ;;
    --log-dir) log_dir=${2:?--log-dir needs a directory}; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; ctest_args+=("$@"); break ;;
    *) ctest_args+=("$1") ;;
  esac
  shift
done

# ---- factor levels ----------------------------------------------------------
# The core names of the OpenBLAS that dlopen("libopenblas.so.0") gives (what
# fsc loads), oldest first, from the library's corename table.
openblas_cores() {
  python3 - <<'EOF'
import ctypes
ctypes.CDLL("libopenblas.so.0")
path = next(l.split()[-1] for l in open("/proc/self/maps") if "openblas" in l)
data = open(path, "rb").read()
i = data.find(b"Katmai\0")
names = [s.decode("ascii", "replace") for s in data[i:i + 1000].split(b"\0") if s] if i >= 0 else []
names = names[:names.index("Unknown")] if "Unknown" in names else []
print(path, *names)
EOF
}
read -r openblas_path core_names <<<"$(openblas_cores)"
newest=${core_names##* }
blas_levels="Haswell SkylakeX Cooperlake"
case " $blas_levels " in
  *" ${newest:-Cooperlake} "*) newest_note="the newest name it knows, ${newest:-?}, is already a level" ;;
  *) blas_levels="$blas_levels $newest"; newest_note="the newest name it knows, $newest, is a level" ;;
esac
blas_levels="$blas_levels cpuid"

# glibc 2.36 accepts these hwcaps names (checked with --list-diagnostics);
# names it does not know, such as AVX512_BF16, are ignored without a word.
avx512_mask="-AVX512F,-AVX512CD,-AVX512BW,-AVX512DQ,-AVX512VL"
glibc_tunables() {
  case "$1" in
    default) echo "" ;;
    no-avx512) echo "glibc.cpu.hwcaps=$avx512_mask" ;;
    no-avx2-fma) echo "glibc.cpu.hwcaps=-AVX2,-FMA,$avx512_mask" ;;
  esac
}

# ---- the matrix -------------------------------------------------------------
# One line per cell: number, build, blas, glibc, l2, threads (tab-separated),
# after a line "# matrix: ..." with the coverage check. The pairwise array is
# a deterministic greedy: every blas x glibc combination once (the two factors
# with most values), each with the build/l2/threads values that cover the
# most pairs not yet covered (the first such in cross-product order); then,
# while pairs remain, the first cell of the cross product covering the most.
matrix() {
  python3 - "$mode" "release asan" "$blas_levels" "default no-avx512 no-avx2-fma" \
    "unset 512" "1 2" <<'EOF'
import itertools, sys
mode, levels = sys.argv[1], [a.split() for a in sys.argv[2:]]
names = ["build", "blas", "glibc", "l2", "threads"]
product = list(itertools.product(*levels))
def pairs(row):
    return {(i, row[i], j, row[j]) for i, j in itertools.combinations(range(len(row)), 2)}
every = set().union(*map(pairs, product))
if mode == "full":
    rows = product
else:
    rows, todo = [], set(every)
    for b, g in itertools.product(levels[1], levels[2]):
        best = max((r for r in product if r[1] == b and r[2] == g),
                   key=lambda r: len(pairs(r) & todo))
        rows.append(best)
        todo -= pairs(best)
    while todo:
        best = max(product, key=lambda r: len(pairs(r) & todo))
        rows.append(best)
        todo -= pairs(best)
    rows.sort(key=lambda r: [levels[k].index(v) for k, v in enumerate(r)])
covered = set().union(*map(pairs, rows))
missing = every - covered
print(f"# matrix: {mode}, {len(rows)} of {len(product)} cells; pairwise coverage: "
      f"{len(covered & every)} of {len(every)} value pairs"
      + (" -- MISSING " + str(sorted(missing)[:5]) if missing else ", all covered (checked)"))
for n, row in enumerate(rows, 1):
    print(n, *row, sep="\t")
EOF
}

# Whether cell number $1 is selected by --cells (all when none given).
selected() {
  [ -z "$cells" ] && return 0
  local part
  for part in ${cells//,/ }; do
    case "$part" in
      *-*) [ "$1" -ge "${part%-*}" ] && [ "$1" -le "${part#*-}" ] && return 0 ;;
      *) [ "$1" -eq "$part" ] && return 0 ;;
    esac
  done
  return 1
}

build_dir() { if [ "$1" = release ]; then echo build; else echo build-sanitize; fi; }

# The command prefix that gives a cell its environment: cell_env blas glibc l2 threads
cell_env=()
set_cell_env() {
  local t
  t=$(glibc_tunables "$2")
  cell_env=(env -u OPENBLAS_CORETYPE -u GLIBC_TUNABLES -u OPENBLAS_L2_SIZE
    OMP_NUM_THREADS="$4" FSC_NUM_THREADS="$4")
  [ "$1" != cpuid ] && cell_env+=(OPENBLAS_CORETYPE="$1")
  [ -n "$t" ] && cell_env+=(GLIBC_TUNABLES="$t")
  [ "$3" != unset ] && cell_env+=(OPENBLAS_L2_SIZE="$3")
  return 0
}

matrix_out=$(matrix)
coverage=$(head -n 1 <<<"$matrix_out")
matrix_rows=$(tail -n +2 <<<"$matrix_out")
echo "== OpenBLAS: $openblas_path; $(wc -w <<<"$core_names") core names (${core_names%% *} ... $newest); $newest_note"
echo "== ${coverage#\# }"
[ -n "$cells" ] && echo "== running cells $cells only (the coverage above is the whole matrix's)"
[ ${#ctest_args[@]} -gt 0 ] && echo "== extra ctest arguments: ${ctest_args[*]}"

if [ "$dry" = 1 ]; then
  echo
  echo "| # | build | blas | glibc | l2 | threads | environment |"
  echo "|---|---|---|---|---|---|---|"
  while IFS=$'\t' read -r n b blas glibc l2 thr; do
    selected "$n" || continue
    set_cell_env "$blas" "$glibc" "$l2" "$thr"
    echo "| $n | $b ($(build_dir "$b")/) | $blas | $glibc | $l2 | $thr | \`${cell_env[*]:1}\` |"
  done <<<"$matrix_rows"
  exit 0
fi

# ---- builds -----------------------------------------------------------------
needed=$(while IFS=$'\t' read -r n b _; do if selected "$n"; then echo "$b"; fi; done <<<"$matrix_rows" | sort -u)
for b in $needed; do
  dir=$(build_dir "$b")
  if [ "$do_build" = 0 ]; then
    [ -x "$dir/tools/fsc-bench" ] || { echo "$dir/ is not built (drop --no-build)" >&2; exit 2; }
  elif [ "$b" = release ] && [ ! -f build/CMakeCache.txt ]; then
    bash scripts/build.sh
  elif [ "$b" = asan ] && [ ! -f build-sanitize/CMakeCache.txt ]; then
    cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DFSC_WERROR=ON -DFSC_ASAN=ON -DFSC_UBSAN=ON >/dev/null
    cmake --build build-sanitize -j "$(nproc)" >/dev/null
  else
    cmake --build "$dir" -j "$(nproc)" >/dev/null
  fi
done

# ---- probes -----------------------------------------------------------------
# glibc under the environment given as arguments: the glibc-hwcaps level and
# AVX512F/AVX2/FMA as ld.so's cpu_features has them, and which of expf (libm),
# memcpy and strlen (libc) changed variant against the unmasked addresses $1.
glibc_probe() {
  local ref=$1
  shift
  "$@" python3 - "$ref" <<'EOF'
import ctypes, subprocess, sys
diag = dict(l.split("=", 1) for l in subprocess.run(
    ["/lib64/ld-linux-x86-64.so.2", "--list-diagnostics"], capture_output=True,
    text=True, check=True).stdout.splitlines() if "=" in l)
def active(leaf, reg, bit):  # features[0]: CPUID leaf 1, [1]: leaf 7; reg 1 ebx, 2 ecx
    return int(diag[f"x86.cpu_features.features[{leaf:#x}].active[{reg:#x}]"], 16) >> bit & 1
subdirs = diag["dl_hwcaps_subdirs"].strip('"').split(":")
on = int(diag["dl_hwcaps_subdirs_active"], 16)
level = next((s for i, s in enumerate(subdirs) if on >> i & 1), "baseline")
bits = {"AVX512F": active(1, 1, 16), "AVX2": active(1, 1, 5), "FMA": active(0, 2, 12)}
maps = [l.split() for l in open("/proc/self/maps")]
def where(lib, sym):
    a = ctypes.cast(getattr(ctypes.CDLL(lib), sym), ctypes.c_void_p).value
    m = next(m for m in maps if int(m[0].split("-")[0], 16) <= a < int(m[0].split("-")[1], 16))
    return f"{sym}@{a - int(m[0].split('-')[0], 16) + int(m[2], 16):#x}"
now = [where("libm.so.6", "expf"), where("libc.so.6", "memcpy"), where("libc.so.6", "strlen")]
if sys.argv[1] == "":
    print(*now)
else:
    moved = [n.split("@")[0] for n, r in zip(now, sys.argv[1].split()) if n != r]
    print(level + ", " + " ".join(f"{k} {'on' if v else 'off'}" for k, v in bits.items())
          + "; switched: " + (" ".join(moved) if moved else "none"))
EOF
}
glibc_ref=$(glibc_probe "" env -u GLIBC_TUNABLES)

field() { sed -n "s/.*\"$1\": \"\\([^\"]*\\)\".*/\\1/p"; }
signame() { if [ "$1" -gt 128 ]; then echo "signal $(($1 - 128)), SIG$(kill -l $(($1 - 128)))"; else echo "exit $1"; fi; }

# ---- the cells --------------------------------------------------------------
log_dir=${log_dir:-$(mktemp -d "${TMPDIR:-/tmp}/fsc-portability.XXXXXX")}
mkdir -p "$log_dir"
log_dir=$(cd "$log_dir" && pwd)
echo "== logs: $log_dir"
table=() notes=() any_failed=0
for_cell() {
  local n=$1 b=$2 blas=$3 glibc=$4 l2=$5 thr=$6 dir log rc info corename gprobe status counts worst
  dir=$(build_dir "$b")
  log="$log_dir/cell$n.log"
  set_cell_env "$blas" "$glibc" "$l2" "$thr"
  echo "== cell $n: $b, blas $blas, glibc $glibc, l2 $l2, threads $thr"
  gprobe=$(glibc_probe "$glibc_ref" "${cell_env[@]}")
  rc=0
  info=$("${cell_env[@]}" OPENBLAS_VERBOSE=2 "$dir/tools/fsc-bench" --blas-info 2>&1) || rc=$?
  corename=$(field corename <<<"$info")
  corename=${corename:-?}
  if grep -q "Core not found" <<<"$info"; then
    notes+=("cell $n: OpenBLAS says \"$(grep -m1 'Core not found' <<<"$info")\": OPENBLAS_CORETYPE=$blas was not taken, its own CPU detection chose $corename")
  fi
  status="" counts="-" worst="-" SECONDS=0
  if [ "$rc" -gt 128 ]; then
    status="not runnable on this CPU: fsc-bench --blas-info died ($(signame "$rc"))"
  elif [ "$rc" != 0 ]; then
    status="FAIL: fsc-bench --blas-info $(signame "$rc")"
  else
    rc=0
    # fsc-bench starts MPI, whose plugins LeakSanitizer reports (as the tests'
    # FSC_MPI_TEST_ENV says), so leak checks are off for this probe alone
    "${cell_env[@]}" ASAN_OPTIONS=detect_leaks=0 "$dir/tools/fsc-bench" --config small --steps 1 --warmup 0 >"$log_dir/cell$n.probe.log" 2>&1 || rc=$?
    if [ "$rc" -gt 128 ]; then
      status="not runnable on this CPU: one training step under these kernels died ($(signame "$rc"))"
    elif [ "$rc" != 0 ]; then
      status="FAIL: the training-step probe ($(signame "$rc"); $log_dir/cell$n.probe.log)"
    fi
  fi
  if [ -z "$status" ] && [ "$probes_only" = 1 ]; then
    status="probed"
  elif [ -z "$status" ]; then
    rc=0 SECONDS=0
    (cd "$dir" && "${cell_env[@]}" ctest -V -j "$(nproc)" -L numerics "${ctest_args[@]}") >"$log" 2>&1 || rc=$?
    # passed/failed/skipped (total), and the largest "N% of the bound at worst"
    # with the test that printed it (ctest -V prefixes output with the test number)
    IFS=$'\t' read -r counts worst < <(awk '
      /^ *Start +[0-9]+: / { sub(/:$/, "", $2); name[$2] = $3 }
      / Test +#[0-9]+: .* Passed / { pass++ }
      / Test +#[0-9]+: .*\*\*\*Skipped/ { skip++ }
      /tests passed, [0-9]+ tests? failed out of [0-9]+/ { fail = $4; total = $NF }
      /% of the bound at worst/ && match($0, /[0-9.]+% of the bound at worst/) {
        p = substr($0, RSTART, RLENGTH) + 0; split($1, id, ":")
        if (name[id[1]] ~ /^fault_/) next  # a fault test passes by exceeding its bound
        lines++
        if (p >= best) { best = p; who = name[id[1]] }
      }
      END { printf "%d/%d/%d (%d)\t%s\n", pass, fail, skip, total,
            lines ? sprintf("%g%% (%s; %d comparisons)", best, who, lines) : "no comparisons" }
      ' "$log")
    if [ "$rc" = 0 ]; then status=PASS; else status="FAIL (ctest exit $rc)"; fi
  fi
  case "$status" in FAIL*) any_failed=1; echo "   $status; log: $log" ;; *) echo "   $status" ;; esac
  table+=("| $n | $b | ${blas/cpuid/unset (fsc: CPUID)} | $corename | $glibc | $gprobe | $l2 | $thr | $status | $counts | $worst | ${SECONDS}s |")
}
# the rows come on fd 3: mpiexec and ctest read standard input, and took
# the rest of the matrix with them after the first cell
while IFS=$'\t' read -r n b blas glibc l2 thr <&3; do
  if selected "$n"; then for_cell "$n" "$b" "$blas" "$glibc" "$l2" "$thr" </dev/null; fi
done 3<<<"$matrix_rows"

echo
echo "| # | build | OPENBLAS_CORETYPE | corename (fsc-bench) | glibc mask | glibc probe (hwcaps level, cpu_features; variants switched vs unmasked) | OPENBLAS_L2_SIZE | OMP/FSC_NUM_THREADS | result | passed/failed/skipped (total) | worst share of a bound | wall |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${table[@]}"
echo
echo "glibc masks: no-avx512 = GLIBC_TUNABLES=$(glibc_tunables no-avx512); no-avx2-fma = GLIBC_TUNABLES=$(glibc_tunables no-avx2-fma)"
for note in "${notes[@]+"${notes[@]}"}"; do echo "note: $note"; done
exit "$any_failed"
