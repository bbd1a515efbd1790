#!/usr/bin/env bash
# The install test: installs a built fsc into a temporary prefix, then builds
# tests/consumer/main.c against that prefix four ways and runs each program:
#   find_package(fsc) + fsc::fsc_static   find_package(fsc) + fsc::fsc
#   pkg-config --static (libfsc.a)        pkg-config (libfsc.so)
# Each link uses only the flags fsc's package files give (plus the build's own
# sanitizer flags, if any). Any failing step fails the test and says which.
#
# usage: run.sh BUILD_DIR VERSION
# environment (tests/CMakeLists.txt sets it): FSC_CMAKE, FSC_CC (the build's C
# compiler), FSC_MPI_C_COMPILER, FSC_CMAKE_GENERATOR, FSC_SONAME,
# FSC_INSTALL_{BINDIR,LIBDIR,INCLUDEDIR}, FSC_CONSUMER_FLAGS.
set -euo pipefail

build=$1 version=$2
here=$(cd "$(dirname "$0")" && pwd)
cmake=${FSC_CMAKE:-cmake}
cc=${FSC_CC:-cc}
read -r -a extra <<<"${FSC_CONSUMER_FLAGS:-}"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fsc-consumer.XXXXXX")
tmp=$(cd "$tmp" && pwd -P) # no symlinks: paths are compared below
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
bindir=$prefix/${FSC_INSTALL_BINDIR:-bin}
libdir=$prefix/${FSC_INSTALL_LIBDIR:-lib}
includedir=$prefix/${FSC_INSTALL_INCLUDEDIR:-include}

step() { echo "== $*"; }
die() {
    echo "install test FAILED: $*" >&2
    exit 1
}
trap 'die "line $LINENO: $BASH_COMMAND"' ERR

# (grep reads its whole input below, never -q: under pipefail an early exit
# can kill the producer with SIGPIPE and fail the pipe at random)
# needed BINARY: its DT_NEEDED entries, one per line.
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
# links_shared BINARY: it loads libfsc.so from the prefix (and no other).
links_shared() {
    needed "$1" | grep -x "$FSC_SONAME" >/dev/null || die "$1 does not need $FSC_SONAME"
    ldd "$1" | grep "$FSC_SONAME => $libdir/" >/dev/null || die "$1 does not load $libdir/$FSC_SONAME"
}
# links_static BINARY: libfsc is inside it.
links_static() { ! needed "$1" | grep '^libfsc' >/dev/null || die "$1 needs a shared libfsc"; }

step "cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix"
for f in "$includedir"/fsc/{fsc,version,export,core,nn}.h "$libdir/libfsc.a" \
    "$libdir/libfsc.so" "$libdir/$FSC_SONAME" "$libdir/pkgconfig/fsc.pc" \
    "$libdir"/cmake/fsc/{fscConfig,fscConfigVersion,fscTargets}.cmake \
    "$bindir"/{fsc-train,fsc-bench,fsc-consolidate}; do
    [ -e "$f" ] || die "not installed: ${f#"$prefix"/}"
done
soname=$(readelf -d "$libdir/libfsc.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "$FSC_SONAME" ] || die "libfsc.so's SONAME is '$soname', want $FSC_SONAME"

step "installed tools: --version"
for tool in "$bindir"/fsc-*; do
    name=$(basename "$tool")
    got=$("$tool" --version) || die "$name --version exited non-zero"
    [ "$got" = "$name $version" ] || die "$name --version printed '$got', want '$name $version'"
done

step "find_package(fsc): fsc::fsc_static and fsc::fsc"
cmake_args=(-S "$here" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON -DCMAKE_C_COMPILER="$cc"
    -DFSC_EXPECTED_VERSION="$version"
    -DCMAKE_C_FLAGS="${extra[*]}" -DCMAKE_EXE_LINKER_FLAGS="${extra[*]}")
[ -n "${FSC_CMAKE_GENERATOR:-}" ] && cmake_args+=(-G "$FSC_CMAKE_GENERATOR")
[ -n "${FSC_MPI_C_COMPILER:-}" ] && cmake_args+=(-DMPI_C_COMPILER="$FSC_MPI_C_COMPILER")
"$cmake" "${cmake_args[@]}"
grep -qx "fsc_DIR:PATH=$libdir/cmake/fsc" "$tmp/cmake/CMakeCache.txt" ||
    die "find_package(fsc) found $(grep '^fsc_DIR' "$tmp/cmake/CMakeCache.txt"), not $prefix"
"$cmake" --build "$tmp/cmake" --verbose
links_static "$tmp/cmake/consumer_static"
links_shared "$tmp/cmake/consumer_shared"
"$tmp/cmake/consumer_static" "$tmp/ckpt-cmake-static"
"$tmp/cmake/consumer_shared" "$tmp/ckpt-cmake-shared" # libfsc found through CMake's RPATH

step "pkg-config fsc: --static (libfsc.a) and shared (libfsc.so)"
export PKG_CONFIG_PATH="$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
pcver=$(pkg-config --modversion fsc)
[ "$pcver" = "$version" ] || die "pkg-config --modversion fsc is '$pcver', want $version"
pclibdir=$(pkg-config --variable=libdir fsc)
[ "$pclibdir" -ef "$libdir" ] || die "fsc.pc's libdir is $pclibdir, not $libdir"
cflags=(-std=c11 -Wall -Wextra -Wpedantic -Werror -DFSC_EXPECTED_VERSION="\"$version\"" "${extra[@]}")
# --static adds Libs.private; the linker still prefers libfsc.so to libfsc.a
# when both lie in one directory, so the archive is named by its path.
read -r -a pc_cflags <<<"$(pkg-config --cflags fsc)"
read -r -a shared_libs <<<"$(pkg-config --libs fsc)"
read -r -a static_libs <<<"$(pkg-config --static --libs fsc)"
for i in "${!static_libs[@]}"; do
    if [ "${static_libs[i]}" = -lfsc ]; then static_libs[i]=$pclibdir/libfsc.a; fi
done
set -x
"$cc" "${cflags[@]}" "${pc_cflags[@]}" "$here/main.c" -o "$tmp/pc_static" "${static_libs[@]}"
"$cc" "${cflags[@]}" "${pc_cflags[@]}" "$here/main.c" -o "$tmp/pc_shared" "${shared_libs[@]}"
set +x
links_static "$tmp/pc_static"
"$tmp/pc_static" "$tmp/ckpt-pc-static"
LD_LIBRARY_PATH="$pclibdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" links_shared "$tmp/pc_shared"
LD_LIBRARY_PATH="$pclibdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$tmp/pc_shared" "$tmp/ckpt-pc-shared"

echo "install test: ok (fsc $version, $FSC_SONAME; find_package and pkg-config, static and shared)"
