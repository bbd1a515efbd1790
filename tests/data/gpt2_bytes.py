"""GPT-2's byte alphabet, shared by the scripts that write the hand-made
tokenizer files beside it (bpe_tiny/make.py, tokenizer_json/make.py)."""


def bytes_to_unicode():
    """{byte: the printable character GPT-2's byte-level BPE writes for it}."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))
