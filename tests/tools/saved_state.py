"""What the fault tests check after a fault: that nothing already saved changed.

tree() fingerprints every file under a directory, so a test compares it
before and after a refused or failed run; checkpoint_problem() checks a
checkpoint directory's `latest` the way fsc's reader does (each member's
size and CRC-32 against its state.json), for runs whose fault lands while
they save. Standard library only (Debian's python3).
"""
import hashlib
import json
import os
import zlib


def tree(root):
    """{relative path: (kind, sha256 of a file's bytes or a link's target)} under root."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(d, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = ("link", os.readlink(path))
            elif os.path.isfile(path):
                with open(path, "rb") as f:
                    out[rel] = ("file", hashlib.sha256(f.read()).hexdigest())
            else:
                out[rel] = ("dir" if os.path.isdir(path) else "other", "")
    return out


def changed(root, before):
    """The paths under root that differ from the fingerprint `before` (sorted)."""
    after = tree(root)
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def checkpoint_problem(ck):
    """(step, "") when ck's `latest` checkpoint has every member as its state.json
    records, else (None, what is wrong)."""
    try:
        with open(os.path.join(ck, "latest")) as f:
            name = f.read().strip()
        with open(os.path.join(ck, name, "state.json")) as f:
            state = json.load(f)
        for member, rec in state["files"].items():
            with open(os.path.join(ck, name, member), "rb") as f:
                data = f.read()
            if len(data) != rec["size"] or zlib.crc32(data) != rec["crc32"]:
                return None, (f"{name}/{member}: {len(data)} bytes, crc32 {zlib.crc32(data)}; "
                              f"state.json says {rec['size']} bytes, crc32 {rec['crc32']}")
        return state["step"], ""
    except (OSError, ValueError, KeyError) as e:
        return None, f"{ck}: {e}"
