"""The README is a front door (issue 28, friction 4): at most 200 lines, and it links
every page of the manual in docs/; every relative link it has resolves to a file.
Usage: check_readme.py REPO_ROOT [README]   (README: another text to judge, for the check
of this check: the 767-line README of before fails it)."""
import os
import re
import sys

MANUAL = ("training", "data", "parallelism", "checkpoints", "library", "performance",
          "environment", "testing", "troubleshooting")
MAX_LINES = 200

root = sys.argv[1]
path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(root, "README.md")
text = open(path, encoding="utf-8").read()
problems = []
lines = text.count("\n")
if lines > MAX_LINES:
    problems.append(f"{lines} lines, more than {MAX_LINES}: usage belongs in docs/, the README "
                    "is what fsc is, the two commands, a first program and links")
links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
for page in MANUAL:
    if f"docs/{page}.md" not in links:
        problems.append(f"no link to docs/{page}.md")
for link in links:
    if "://" in link or link.startswith("mailto:"):
        continue
    if not os.path.exists(os.path.join(root, link)):
        problems.append(f"the link {link} leads nowhere")
if problems:
    sys.exit(f"FAIL: {path}:\n  " + "\n  ".join(problems))
print(f"ok  README: {lines} lines, links every manual page, {len(links)} links resolve")
