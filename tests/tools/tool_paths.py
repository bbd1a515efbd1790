#!/usr/bin/env python3
"""Every tool's path arguments against the things a path can be besides a good
file: a FIFO (nothing will ever write to it), /dev/zero (endless), a
directory, a link to /dev/zero, a missing file, and for outputs a place that
cannot be written (under /proc: read-only even for root, who ignores
permissions). Each run must end within 20 s (a FIFO must not block it, an
endless file must not grow it), without a signal, with a non-zero exit and a
message naming the path. Then the links planted at names a tool writes beside
its output (config.json's and a shard's temporary) must not be followed.

usage: tool_paths.py TOOL_PATH...     Exit 0 = pass, 1 = fail.
"""
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

TOOLS = {os.path.basename(p): p for p in sys.argv[1:]}
TMP = tempfile.mkdtemp(prefix="fsc-paths-")
TINY = ["--layers", "1", "--d-model", "32", "--heads", "2", "--seq", "16", "--batch", "2",
        "--steps", "1", "--quiet"]


def run(tool, *args):
    try:
        return subprocess.run([TOOLS[tool], *map(str, args)], capture_output=True, text=True,
                              timeout=20, cwd=TMP, start_new_session=True)
    except subprocess.TimeoutExpired:
        sys.exit(f"FAIL: {tool} {' '.join(map(str, args))}: still running after 20 s")


def run_all(cases):
    """run(tool, *args) for each (tool, args) of cases, eight at a time, the results in
    order. The refusals are independent, and each fsc-train spends ~1 s of its own
    waiting for Open MPI's singleton start-up (orted), not computing; one after the
    other they were most of this test's time."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(lambda c: run(c[0], *c[1]), cases))


def kinds():
    fifo = os.path.join(TMP, "fifo")
    os.mkfifo(fifo)
    d = os.path.join(TMP, "adir")
    os.mkdir(d)
    link = os.path.join(TMP, "zero-link")
    os.symlink("/dev/zero", link)
    return {"FIFO": fifo, "/dev/zero": "/dev/zero", "directory": d, "link to /dev/zero": link,
            "missing": os.path.join(TMP, "missing", "file")}


# (tool, arguments with {} where the path goes, the kinds that apply)
INPUTS = [
    ("fsc-train", ["--config", "{}"]),
    ("fsc-train", [*TINY, "--data", "{}"]),
    ("fsc-train", [*TINY, "--val-data", "{}", "--eval-every", "1"]),
    ("fsc-train", [*TINY, "--init-from", "{}"]),
    ("fsc-train", [*TINY, "--resume", "{}"]),
    ("fsc-sample", ["--model", "{}", "--max-new-tokens", "2"]),
    ("fsc-plot", ["{}", "-o", "out.svg"]),
    ("fsc-tokenize", ["--tokenizer", "bytes", "{}", "-o", "tok"]),
    ("fsc-consolidate", ["out.safetensors", "{}"]),
]
OUTPUTS = [
    ("fsc-train", [*TINY, "--save", "{}"]),
    ("fsc-train", [*TINY, "--metrics", "{}"]),
    ("fsc-plot", ["{plot_input}", "-o", "{}"]),
    ("fsc-tokenize", ["--tokenizer", "bytes", "{text}", "-o", "{}"]),
]


def fill(args, path, extra):
    return [a.replace("{}", path).format(**extra) if "{" in a else a for a in args]


def main():
    ks = kinds()
    text = os.path.join(TMP, "text.txt")
    with open(text, "w") as f:
        f.write("some text to tokenize\n" * 20)
    plot_input = os.path.join(TMP, "m.jsonl")
    with open(plot_input, "w") as f:
        f.write('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n')
    extra = {"text": text, "plot_input": plot_input}
    # a checkpoint directory is what --resume takes ("no checkpoint here"); -o of
    # fsc-tokenize is a prefix (DIR_train_000000.bin beside the directory is fine)
    inputs = [(tool, args, kind, path) for tool, args in INPUTS for kind, path in ks.items()
              if not (kind == "directory" and "--resume" in args)]
    unwritable = {"read-only (/proc)": "/proc/version/out", "directory": ks["directory"],
                  "missing directory": os.path.join(TMP, "missing", "out")}
    outputs = [(tool, args, kind, path) for tool, args in OUTPUTS
               for kind, path in unwritable.items()
               # fsc-tokenize makes -o's directories (train_vocab-mfu tests that):
               # a missing one is no refusal there, and made while the other
               # cases run it would let them write into it
               if not (kind in ("directory", "missing directory") and tool == "fsc-tokenize")]
    cases = inputs + outputs
    done = run_all([(tool, fill(args, path, extra)) for tool, args, _, path in cases])
    for (tool, args, kind, path), p in zip(cases, done):
        if p.returncode <= 0 or path not in p.stderr:
            sys.exit(f"FAIL: {tool} {' '.join(fill(args, path, extra))} ({kind}): exit "
                     f"{p.returncode}, expected a refusal naming the path:\n{p.stderr}")
    n = len(cases)
    # bare words in a metrics line become null: a one-letter word grows 4x (the copy
    # once had room for 2x: a heap overflow that ASan names, a crash in Release)
    for i, line in enumerate(["a", "[" + ",a" * 1000000 + "]", '{"step": 1e308, "loss": 1}']):
        bad = os.path.join(TMP, f"bad{i}.jsonl")
        with open(bad, "w") as f:
            f.write(line + "\n")
        p = run("fsc-plot", bad, "-o", os.path.join(TMP, "bad.svg"))
        if p.returncode != 1 or "Sanitizer" in p.stderr or "no metrics rows" not in p.stderr:
            sys.exit(f"FAIL: fsc-plot on {line[:20]!r}: exit {p.returncode}:\n{p.stderr[-2000:]}")
        n += 1
    # silent accepts that are refusals now: a key given twice in --config, --balance
    # without --pp, a --checkpoint-dir that cannot be written (found at start-up,
    # before any step), --metrics on a full disk (/dev/full: every write ENOSPC)
    dup = os.path.join(TMP, "dup.json")
    with open(dup, "w") as f:
        f.write('{"layers": 1, "layers": 2}')
    refusals = [(["--config", dup], "given twice"),
                ([*TINY, "--balance", "1,1"], "needs --pp"),
                ([*TINY, "--checkpoint-dir", "/proc/version/ck"], "/proc/version/ck"),
                ([*TINY, "--metrics", "/dev/full"], "/dev/full")]
    for (args, needle), p in zip(refusals, run_all([("fsc-train", a) for a, _ in refusals])):
        if p.returncode <= 0 or needle not in p.stderr or "step 1/" in p.stderr:
            sys.exit(f"FAIL: fsc-train {' '.join(args)}: exit {p.returncode}, expected a refusal "
                     f"with {needle!r}:\n{p.stderr}")
        n += 1
    # weights that hold NaN: fsc-sample refuses instead of printing token 0
    good = os.path.join(TMP, "good.safetensors")
    p = run("fsc-train", *TINY, "--save", good)
    with open(good, "rb") as f:
        data = bytearray(f.read())
    hlen = int.from_bytes(data[:8], "little")
    nan = bytes.fromhex("0000c07f")  # float32 NaN, little-endian
    data[8 + hlen:] = nan * ((len(data) - 8 - hlen) // 4)
    bad = os.path.join(TMP, "nan.safetensors")
    with open(bad, "wb") as f:
        f.write(data)
    p = run("fsc-sample", "--model", bad, "--max-new-tokens", "2")
    if p.returncode <= 0 or "not finite" not in p.stderr:
        sys.exit(f"FAIL: fsc-sample on NaN weights: exit {p.returncode}:\n{p.stdout}{p.stderr}")
    n += 1
    # links planted where a tool used to write a temporary of a fixed name
    victim = os.path.join(TMP, "victim")
    with open(victim, "w") as f:
        f.write("keep")
    out = os.path.join(TMP, "w")
    os.mkdir(out)
    os.symlink(victim, os.path.join(out, "config.json.tmp"))
    os.symlink(victim, os.path.join(out, "tok_train_000000.bin.tmp"))
    p = run("fsc-train", *TINY, "--save", os.path.join(out, "model.safetensors"))
    q = run("fsc-tokenize", "--tokenizer", "bytes", text, "-o", os.path.join(out, "tok"))
    with open(victim) as f:
        kept = f.read()
    if p.returncode or q.returncode or kept != "keep":
        sys.exit(f"FAIL: planted links: fsc-train exit {p.returncode}, fsc-tokenize exit "
                 f"{q.returncode}, the link's target now holds {kept!r}:\n{p.stderr}{q.stderr}")
    if not os.path.exists(os.path.join(out, "config.json")):
        sys.exit("FAIL: fsc-train --save wrote no config.json")
    print(f"PASS: {n} path refusals, and planted links at temporary names not followed")


main()
