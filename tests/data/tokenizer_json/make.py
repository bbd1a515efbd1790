#!/usr/bin/env python3
"""Writes the hand-made tokenizer.json files of tests/io/test_tokenizer_json.c:
a byte-level BPE vocabulary (the 256 byte tokens in GPT-2's order, a few
merges, "xyz" reachable only whole), its merges as "a b" strings
(strings.json: ignore_merges, a BOS/EOS template) and as ["a", "b"] pairs
(pairs.json), a Sequence pre-tokenizer of Splits (split.json), and files
fsc must refuse (metaspace.json, unigram.json); nfc.json is strings.json
with Qwen 2's NFC normalizer (tests/io/test_tokenizer_nfc.c)."""
import copy, json, os, sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gpt2_bytes import bytes_to_unicode  # noqa: E402 (tests/data)

b2u = bytes_to_unicode()
vocab = {b2u[b]: i for i, b in enumerate(b2u)}
merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "1 2", "12 3"]
for m in merges:
    a, b = m.split(" ")
    vocab[a + b] = len(vocab)
vocab["xyz"] = len(vocab)  # 267: no merge makes it
V = len(vocab)
added = [
    {"id": V, "content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False,
     "normalized": False, "special": True},
    {"id": V + 1, "content": "<s>", "single_word": False, "lstrip": False, "rstrip": False,
     "normalized": False, "special": True},
    {"id": V + 2, "content": "[MASK]", "single_word": False, "lstrip": True, "rstrip": False,
     "normalized": True, "special": False},
]
byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
base = {
    "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
    "normalizer": None, "pre_tokenizer": byte_level,
    "post_processor": {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [V + 1], "tokens": ["<s>"]},
                           "<|endoftext|>": {"id": "<|endoftext|>", "ids": [V],
                                             "tokens": ["<|endoftext|>"]}}},
    "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
              "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
              "ignore_merges": True, "vocab": vocab, "merges": merges},
}
files = {"strings.json": base}
pairs = copy.deepcopy(base)
pairs["model"]["merges"] = [m.split(" ") for m in merges]
pairs["model"]["ignore_merges"] = False
pairs["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True}
files["pairs.json"] = pairs
split = copy.deepcopy(base)
split["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}| ?\\p{L}+|\\s+"}, "behavior": "Isolated",
     "invert": False},
    {"type": "Split", "pattern": {"String": "-"}, "behavior": "Removed", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
files["split.json"] = split
meta = copy.deepcopy(base)
meta["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                         "split": True}
files["metaspace.json"] = meta
uni = copy.deepcopy(base)
uni["model"] = {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0], ["a", -1.0]],
                "byte_fallback": False}
files["unigram.json"] = uni
nfc = copy.deepcopy(base)
nfc["normalizer"] = {"type": "NFC"}
files["nfc.json"] = nfc
here = os.path.dirname(os.path.abspath(__file__))
for name, obj in files.items():
    with open(os.path.join(here, name), "w") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")
