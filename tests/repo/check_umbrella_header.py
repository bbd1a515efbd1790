#!/usr/bin/env python3
"""fsc/fsc.h reaches the whole public API: every header is listed or excused.

Every header of include/fsc/ (and every template such as version.h.in, by the
name of the header CMake generates from it) must be either included by
include/fsc/fsc.h (`#include "fsc/NAME.h"`) or named on its `excluded:` line,
a deliberate exception whose reason fsc.h states next to it. A name on that
line that is no header, or a header both included and excluded, fails too, so
the list cannot rot.

usage: check_umbrella_header.py [INCLUDE_FSC_DIR]
default: include/fsc of this repository. Exit 0: complete; 1: a header is
missed (each listed); 2: usage error or a scan that found nothing.
"""
import glob
import os
import re
import sys


def main(argv):
    if len(argv) > 2:
        print(__doc__, file=sys.stderr)
        return 2
    here = os.path.dirname(os.path.abspath(__file__))
    folder = argv[1] if len(argv) == 2 else os.path.join(here, "..", "include", "fsc")
    umbrella = os.path.join(folder, "fsc.h")
    try:
        with open(umbrella, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        print(f"{umbrella}: {e}", file=sys.stderr)
        return 2
    headers = set()
    for path in glob.glob(os.path.join(folder, "*.h")) + glob.glob(os.path.join(folder, "*.h.in")):
        name = os.path.basename(path)
        if name.endswith(".in"):
            name = name[: -len(".in")]
        if name != "fsc.h":
            headers.add("fsc/" + name)
    included = set(re.findall(r'^\s*#\s*include\s+"(fsc/[A-Za-z0-9_]+\.h)"', text, re.M))
    m = re.search(r"^\s*\*?\s*excluded:([^\n]*)$", text, re.M)
    excluded = set(m.group(1).split()) if m else set()
    if not headers or not included:
        print(f"{folder}: no public header or no include found (broken scan)", file=sys.stderr)
        return 2
    bad = []
    for h in sorted(headers - included - excluded):
        bad.append(f"{umbrella}: {h} is neither included nor on the 'excluded:' line")
    for h in sorted(included & excluded):
        bad.append(f"{umbrella}: {h} is both included and excluded")
    for h in sorted((included | excluded) - headers):
        bad.append(f"{umbrella}: {h} names no header of {folder}")
    for line in bad:
        print(line)
    if bad:
        return 1
    print(f"fsc.h: {len(included)} headers included, {len(excluded)} excluded, of {len(headers)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
