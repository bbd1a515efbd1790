#!/usr/bin/env python3
"""The code cites only what is in the repository: every "docs/architecture.md,
decision N" names a decision that docs/architecture.md numbers, and nothing
under src/, include/, tools/ or tests/ cites DESIGN.md or ../shared/ (files
beside the project that a reader of it does not have).

usage: check_citations.py REPO_ROOT     Exit 0 = pass, 1 = fail.
"""
import os
import re
import sys

root = sys.argv[1]
with open(os.path.join(root, "docs", "architecture.md")) as f:
    numbered = {int(n) for n in re.findall(r"\*\*Decision ([0-9]+)\.", f.read())}
cite = re.compile(r"docs/architecture\.md,\s+(?:\*\s+)?decisions?\s+([0-9]+(?:(?:-| and |, )[0-9]+)*)")
outside = re.compile(r"DESIGN\.md|\.\./shared/")
bad = []
for top in ("src", "include", "tools", "tests"):
    for d, _, files in os.walk(os.path.join(root, top)):
        for name in files:
            if not name.endswith((".c", ".h", ".py", ".in")) or name == "check_citations.py":
                continue
            path = os.path.join(d, name)
            text = open(path, encoding="utf-8", errors="replace").read()
            rel = os.path.relpath(path, root)
            for m in outside.finditer(text):
                bad.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: cites {m.group(0)}, "
                           "which is outside the repository")
            for m in cite.finditer(text):
                nums = [int(x) for x in re.findall(r"[0-9]+", m.group(1))]
                if "-" in m.group(1):
                    nums = list(range(nums[0], nums[-1] + 1))
                for n in nums:
                    if n not in numbered:
                        bad.append(f"{rel}: cites decision {n}, which docs/architecture.md "
                                   f"does not number (it has {sorted(numbered)})")
if bad:
    sys.exit("FAIL:\n" + "\n".join(bad))
print(f"PASS: every citation resolves ({len(numbered)} numbered decisions)")
