#!/usr/bin/env python3
"""Writes src/io/bpe_unicode.c: the Unicode letter and number ranges GPT-2's
pre-tokenizer regex needs (\\p{L}, \\p{N}), from Python's unicodedata."""
import unicodedata
def ranges(pred):
    r=[];s=None
    for c in range(0x110000):
        ok=pred(c)
        if ok and s is None: s=c
        if not ok and s is not None: r.append((s,c-1)); s=None
    if s is not None: r.append((s,0x10FFFF))
    return r
L=ranges(lambda c: unicodedata.category(chr(c)).startswith('L'))
N=ranges(lambda c: unicodedata.category(chr(c)).startswith('N'))
out=[]
out.append("/* Unicode letters (\\p{L}) and numbers (\\p{N}) for GPT-2's pre-tokenizer, as")
out.append(" * sorted inclusive ranges of code points (Unicode %s)." % unicodedata.unidata_version)
out.append(" *")
out.append(" * Generated, not written: python3 scripts/gen_bpe_unicode.py > src/io/bpe_unicode.c")
out.append(" * (the categories come from Python's unicodedata). */")
out.append('#include "io/bpe_internal.h"')
out.append("")
def emit(name, rs):
    out.append("const uint32_t %s[][2] = {" % name)
    line="   "
    for a,b in rs:
        item=" {0x%X, 0x%X}," % (a,b)
        if len(line)+len(item) > 99:
            out.append(line); line="   "
        line+=item
    out.append(line)
    out.append("};")
    out.append("const int %s_count = %d;" % (name, len(rs)))
emit("fsc_bpe_letters", L)
out.append("")
emit("fsc_bpe_numbers", N)
print("\n".join(out))
