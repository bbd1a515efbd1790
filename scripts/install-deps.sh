#!/usr/bin/env bash
# Installs the Debian packages fsc needs, only those missing.
# Called by both README commands and by .ci/run; safe to run repeatedly.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libopenblas-dev        # CBLAS; fsc selects the AVX-512 kernels itself
  libopenmpi-dev openmpi-bin
  libcjson-dev           # safetensors headers, checkpoint manifests
  libpcre2-dev           # tokenizer.json's pre-tokenizer regexes (Unicode, JIT)
  libicu-dev             # tokenizer.json's NFC normalizer (Qwen 2)
  zlib1g-dev             # checkpoint checksums (CRC-32)
  libcmocka-dev          # unit tests
  libomp-dev
  libdnnl2               # oneDNN, dlopened for bf16 GEMMs (no headers needed; absent: sgemm)
  python3 python3-numpy
  doxygen                # the API reference (ctest api_docs, target api-docs)
  clang libclang-rt-dev  # libFuzzer harnesses (scripts/fuzz.sh; test.sh's fuzz smoke)
  lld                    # links test.sh's sanitizer build faster (ld.bfd without it)
)
# PyTorch cross-checks (a model saved by fsc evaluated in PyTorch), golden
# regeneration and the peer benchmark; FSC_NO_TORCH=1 skips it (those tests skip).
if [ "${FSC_NO_TORCH:-0}" != 1 ]; then packages+=(python3-torch); fi
# MPICH beside Open MPI, for a -DFSC_MPICH=ON build (Open MPI stays the default).
if [ "${FSC_MPICH:-0}" = 1 ]; then packages+=(libmpich-dev mpich); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
