#!/usr/bin/env python3
"""Doxygen input filter for fsc's public headers (docs/api/Doxyfile.in).

The headers document every declaration in plain C comments, written for a
reader of the header, not in Doxygen's markup. This filter turns each comment
that opens a line into a documentation comment (the first one
documents the file) and escapes the characters
Doxygen would read as commands or HTML (regexes, `<dir>` placeholders,
"\\r"), so the reference shows the text as written. Code is passed unchanged;
line numbers are kept, so Doxygen's messages point at the header's own lines.
"""
import re
import sys

ESCAPE = re.compile(r"([\\@&#%$])")
HTML = {"<": "&lt;", ">": "&gt;"}


def escape_plain(text):
    text = ESCAPE.sub(r"\\\1", text)
    return re.sub(r"[<>]", lambda m: HTML[m.group(0)], text)


def escape(text):
    """Escapes a comment's text; Doxygen shows "quoted" text literally, so
    the parts of a line between double quotes are left as they are."""
    lines = []
    for line in text.split("\n"):
        parts = line.split('"')
        lines.append('"'.join(p if k % 2 else escape_plain(p) for k, p in enumerate(parts)))
    return "\n".join(lines)


def filter_source(src):
    out, i, n = [], 0, len(src)
    out_has_doc = False
    while i < n:
        start = src.find("/*", i)
        if start < 0:
            out.append(src[i:])
            break
        # a "/*" inside a string literal on this line is code, not a comment
        line_start = src.rfind("\n", 0, start) + 1
        if src.count('"', line_start, start) % 2:
            out.append(src[i:start + 2])
            i = start + 2
            continue
        end = src.find("*/", start + 2)
        if end < 0:
            end = n
        out.append(src[i:start])
        body = src[start + 2:end]
        if body.startswith("*"):  # already a Doxygen comment: leave as is
            out.append("/*" + body)
        else:
            # the comment documents the next declaration, or the one it
            # trails on the same line ("int x; /* ... */")
            trailing = src[line_start:start].strip() != ""
            # the file's first comment describes the header itself
            # (\file at its end, where it adds no line)
            first = not trailing and not out_has_doc
            out_has_doc = True
            out.append(("/**<" if trailing else "/**") + escape(body) + (" \\file " if first else ""))
        out.append(src[end:end + 2])
        i = end + 2
    return "".join(out)


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        sys.stdout.write(filter_source(f.read()))
