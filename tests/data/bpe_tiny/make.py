#!/usr/bin/env python3
"""Writes the hand-made BPE vocabulary of tests/io/test_bpe.c (encoder.json and
vocab.bpe in GPT-2's format): the 256 byte tokens in GPT-2's order, a few
merges chosen so that merge order, pre-tokenization and repeated pairs
each show in the ids, and <|endoftext|> last."""
import json, os, sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gpt2_bytes import bytes_to_unicode  # noqa: E402 (tests/data)

b2u = bytes_to_unicode()
enc = {b2u[b]: i for i, b in enumerate(b2u)}  # ids 0..255 in GPT-2's byte order
merges = ["l l", "e ll", "h e", "h ell", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld",
          "a a", "aa aa", "t '", "Ġ Ġ", "Ġ b", "2 0", "a 2", "Ã ©"]
for m in merges:
    a, b = m.split(" ")
    enc[a + b] = len(enc)
enc["<|endoftext|>"] = len(enc)
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "encoder.json"), "w") as f:
    json.dump(enc, f, ensure_ascii=False)
with open(os.path.join(here, "vocab.bpe"), "w") as f:
    f.write("#version: 0.2\n" + "\n".join(merges) + "\n")
