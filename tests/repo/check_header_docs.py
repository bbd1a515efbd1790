#!/usr/bin/env python3
"""Every public function of fsc carries a comment: the header is its contract.

Scans the public headers (include/fsc/*.h and templates such as
include/fsc/version.h.in, from which CMake generates a header) for every
declaration that contains FSC_API, however many lines it spans, and fails
when one is undocumented.

The rule. A declaration is documented when either
  1. a comment ends on the line directly above its first line, and that line
     holds nothing but the comment (so a blank line between comment and
     declaration, or a previous declaration's trailing comment, does not
     count); or
  2. a comment follows the code on the declaration's last line (the one with
     its ';'), as in `FSC_API void fsc_scale(float *x, float s, int64_t n); /* x *= s */`.
A bare section banner (`/* ---- logging ---- */`, one line of dashes or equals
signs around a title) and an empty comment document nothing. Each declaration
needs its own comment: one comment above a run of declarations documents the
first of them only, so each of the others says, at least in a trailing
comment, what sets it apart. Preprocessor lines are skipped (`#define FSC_API`
is no declaration), and so are comments and string literals when looking for
FSC_API.

usage: check_header_docs.py [PATH...]
PATH is a header or a folder of headers; default: include/fsc of this
repository. Exit 0: all documented; 1: some are not (each listed as
file:line: name); 2: usage error or no declaration found (a broken scan must
not pass).
"""
import glob
import os
import re
import sys

BANNER = re.compile(r"^\s*[-=]{3,}.*[-=]{3,}\s*$")
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Comment:
    def __init__(self, start, end, text, code_before, code_after):
        self.start, self.end, self.text = start, end, text
        self.code_before = code_before  # code precedes it on its first line
        self.code_after = code_after  # code follows it on its last line

    def documents(self):
        body = self.text.strip()
        if not body:
            return False
        return not (self.start == self.end and BANNER.match(body))


def lex(src):
    """Splits C source into code and comments.

    Returns (code_lines, comments): code_lines[i] is line i+1 with comments
    and string/char literal contents blanked (preprocessor lines kept as
    they are, minus comments); comments is a list of Comment with 1-based
    lines, `//` runs on consecutive comment-only lines merged into one.
    """
    out = []  # code characters, newlines kept
    comments = []
    i, n, line = 0, len(src), 1
    while i < n:
        c = src[i]
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            text = src[i + 2 : max(i + 2, j - 2)]
            start = line
            # Comment lines that are continuation lines start with " * ".
            body = "\n".join(re.sub(r"^\s*\*(?!/)", "", ln) for ln in text.split("\n"))
            line += src.count("\n", i, j)
            comments.append([start, line, body, i, j])
            out.append("\n" * src.count("\n", i, j) or " ")
            i = j
        elif src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            comments.append([line, line, src[i + 2 : j], i, j])
            out.append(" ")
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            out.append(c + " " * max(0, j - i - 1) + c)
            i = j + 1
        else:
            if c == "\n":
                line += 1
            out.append(c)
            i += 1
    code = "".join(out)
    code_lines = code.split("\n")
    merged = []
    for start, end, body, i, j in comments:
        first_ln = src.rfind("\n", 0, i) + 1
        last_ln = src.find("\n", j)
        last_ln = len(src) if last_ln < 0 else last_ln
        before = src[first_ln:i].strip() != ""
        after = src[j:last_ln].strip() != "" and not src[j:last_ln].strip().startswith(("/*", "//"))
        cm = Comment(start, end, body, before, after)
        prev = merged[-1] if merged else None
        if (prev and not prev.code_before and not cm.code_before and prev.end + 1 == cm.start
                and src.startswith("//", i)):
            prev.end, prev.text, prev.code_after = cm.end, prev.text + "\n" + cm.text, cm.code_after
        else:
            merged.append(cm)
    return code_lines, merged


def declarations(code_lines):
    """Yields (first_line, last_line, name) of each FSC_API declaration."""
    k, total = 0, len(code_lines)
    while k < total:
        ln = code_lines[k]
        if ln.lstrip().startswith("#") or not re.search(r"\bFSC_API\b", ln):
            k += 1
            continue
        first, text, depth = k, [], 0
        end = None
        while k < total and end is None:
            cur = code_lines[k]
            if cur.lstrip().startswith("#"):  # #if around an attribute
                k += 1
                continue
            for pos, ch in enumerate(cur):
                if ch in "([":
                    depth += 1
                elif ch in ")]":
                    depth -= 1
                elif ch in ";{" and depth == 0:
                    end = k
                    text.append(cur[: pos + 1])
                    break
            else:
                text.append(cur)
                k += 1
        if end is None:
            end = total - 1
        decl = " ".join(text)
        paren = decl.find("(")
        head = decl[:paren] if paren >= 0 else decl.rstrip(";{ ")
        names = [w for w in IDENT.findall(head) if w != "FSC_API"]
        yield first + 1, end + 1, names[-1] if names else "?"
        k = end + 1


def check_file(path):
    """Returns (declarations, undocumented [(line, name)])."""
    with open(path, encoding="utf-8") as f:
        src = f.read()
    code_lines, comments = lex(src)
    ends_on = {}  # last line -> comment that stands alone on its lines
    trailing = {}  # line -> comment after code on that line
    for cm in comments:
        if cm.code_before:
            trailing.setdefault(cm.start, cm)
        elif not cm.code_after:
            ends_on[cm.end] = cm
    count, bad = 0, []
    for first, last, name in declarations(code_lines):
        count += 1
        above = ends_on.get(first - 1)
        after = trailing.get(last)
        if not ((above and above.documents()) or (after and after.documents())):
            bad.append((first, name))
    return count, bad


def headers(args):
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    paths = args or [os.path.join(root, "include", "fsc")]
    files = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(glob.glob(os.path.join(p, "*.h")) + glob.glob(os.path.join(p, "*.h.in")))
        elif os.path.isfile(p):
            files.append(p)
        else:
            sys.exit(f"check_header_docs: no such file or folder: {p}")
    return files


def main(argv):
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    files = headers(argv)
    total, undocumented = 0, []
    for path in files:
        count, bad = check_file(path)
        total += count
        undocumented += [(path, line, name) for line, name in bad]
    if total == 0:
        print(f"check_header_docs: no FSC_API declaration found in {len(files)} file(s)")
        return 2
    for path, line, name in undocumented:
        print(f"{path}:{line}: {name}: FSC_API declaration without a comment above it "
              f"or after it on its last line")
    print(f"check_header_docs: {total} FSC_API declarations in {len(files)} headers, "
          f"{len(undocumented)} undocumented")
    return 1 if undocumented else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
