#!/usr/bin/env python3
"""Every fsc tool's command line, through the one flag parser (tools/tool_flags.c):
--help and --version answer, --flag=value and --flag value mean the same, and a
bad command line (unknown flag, abbreviation, missing or malformed value,
stray argument) exits 2 with one message naming the tool and the flag.

usage: tools_cli.py TOOL_PATH...     Exit 0 = pass, 1 = fail.
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

TOOLS = {os.path.basename(p): p for p in sys.argv[1:]}
TMP = tempfile.mkdtemp(prefix="fsc-cli-")


def run(tool, *args):
    return subprocess.run([TOOLS[tool], *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=TMP, start_new_session=True)


def fail(msg):
    sys.exit("FAIL: " + msg)


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def common_behaviour(tool):
    p = run(tool, "--help")
    if p.returncode != 0 or not p.stdout.startswith("usage: " + tool) or "--version" not in p.stdout:
        fail(f"{tool} --help: exit {p.returncode}, stdout:\n{p.stdout}{p.stderr}")
    p = run(tool, "-h")
    if p.returncode != 0 or not p.stdout.startswith("usage: " + tool):
        fail(f"{tool} -h: exit {p.returncode}")
    p = run(tool, "--version")
    if p.returncode != 0 or not p.stdout.startswith(tool + " ") or len(p.stdout.split()) != 2:
        fail(f"{tool} --version: exit {p.returncode}, {p.stdout!r}")
    version = p.stdout.strip()
    refusals = [
        (["--bogus-flag", "1"], 'unknown flag "--bogus-flag"'),
        (["--bogus-flag=1"], 'unknown flag "--bogus-flag"'),
        (["--vers"], "flags are spelled in full: --version?"),
        (["--help=yes"], "--help takes no value"),
    ]
    for args, needle in refusals:
        p = run(tool, *args)
        if p.returncode != 2 or needle not in p.stderr or not p.stderr.startswith(tool + ": "):
            fail(f"{tool} {' '.join(args)}: exit {p.returncode}, expected '{tool}: ...{needle}':"
                 f"\n{p.stderr}")
    print(f"ok  {version}: --help, -h, --version; unknown, abbreviated and valued --help refused")


def same(tool, a, b, needle):
    """Both command lines fail the same way, with a message holding needle."""
    pa, pb = run(tool, *a), run(tool, *b)
    if pa.returncode == 0 or pa.returncode != pb.returncode or needle not in pa.stderr or \
            pa.stderr != pb.stderr:
        fail(f"{tool}: {a} and {b} differ or lack {needle!r}:\n{pa.stderr}\n{pb.stderr}")


def train():
    out = {}
    for form in ("eq", "sep"):
        path = os.path.join(TMP, f"init-{form}.safetensors")
        args = {"layers": 2, "d-model": 64, "heads": 4, "seq": 32, "steps": 0, "seed": 7,
                "save-init": path}
        argv = [f"--{k}={v}" for k, v in args.items()] if form == "eq" else \
            [x for k, v in args.items() for x in (f"--{k}", str(v))]
        p = run("fsc-train", *argv, "--quiet=true")
        if p.returncode != 0:
            fail(f"fsc-train {argv}: exit {p.returncode}:\n{p.stderr}")
        out[form] = digest(path)
    if out["eq"] != out["sep"]:
        fail("fsc-train: --flag=value and --flag value gave different initial weights")
    same("fsc-train", ["--steps=abc"], ["--steps", "abc"], '--steps: "abc" is not a valid integer')
    same("fsc-train", ["--quiet=maybe"], ["--quiet=maybe"], '--quiet: "maybe" is not true or false')
    same("fsc-train", ["--lay", "2"], ["--lay=2"], "flags are spelled in full: --layers?")
    same("fsc-train", ["--batch"], ["--batch"], "--batch needs a value")
    same("fsc-train", ["stray"], ["stray"], 'unexpected argument "stray"')
    print("ok  fsc-train: the same weights from --flag=value and --flag value; bad values named")


def bench():
    same("fsc-bench", ["--config=huge"], ["--config", "huge"], "--config huge: expected small")
    same("fsc-bench", ["--steps=x"], ["--steps", "x"], '--steps: "x" is not a valid integer')
    for args in (["--blas-info"], ["--blas-info=true"]):
        p = run("fsc-bench", *args)
        if p.returncode != 0 or "openblas_coretype" not in json.loads(p.stdout):
            fail(f"fsc-bench {args}: exit {p.returncode}:\n{p.stdout}{p.stderr}")
    print("ok  fsc-bench: both forms reach the value; --blas-info and --blas-info=true")


def sample():
    missing = os.path.join(TMP, "nowhere.safetensors")
    same("fsc-sample", [f"--model={missing}"], ["--model", missing], "nowhere.safetensors")
    same("fsc-sample", ["--model=x", "--top-k=-1"], ["--model", "x", "--top-k", "-1"], "--top-k")
    same("fsc-sample", ["--prompt", "hi"], ["--prompt=hi"], "--model PATH is required")
    print("ok  fsc-sample: both forms reach the value; ranges named")


def plot():
    m = os.path.join(TMP, "m.jsonl")
    with open(m, "w") as f:
        for s in range(1, 6):
            f.write(json.dumps({"step": s, "loss": 5.0 / s, "lr": 1e-3, "tokens_per_s": 1000}) + "\n")
    outs = []
    for i, argv in enumerate((["-o", "a.svg"], ["--output=b.svg", "--title=t"],
                              ["--output", "c.svg", "--title", "t"])):
        p = run("fsc-plot", m, *argv)
        if p.returncode != 0:
            fail(f"fsc-plot {argv}: exit {p.returncode}:\n{p.stderr}")
        outs.append(digest(os.path.join(TMP, "abc"[i] + ".svg")))
    if outs[1] != outs[2]:
        fail("fsc-plot: --output=F --title=T and --output F --title T drew different pictures")
    same("fsc-plot", [m], [m], "-o FILE.svg is required")
    print("ok  fsc-plot: -o, --output=F and --output F; the same picture")


def consolidate():
    missing = os.path.join(TMP, "no-such-dir")
    pa, pb = run("fsc-consolidate", "out.safetensors", f"--dir={missing}"), \
        run("fsc-consolidate", f"--dir", missing, "out.safetensors")
    if pa.returncode != 1 or pb.returncode != 1 or missing not in pa.stderr or \
            pa.stderr != pb.stderr:
        fail(f"fsc-consolidate --dir=D / --dir D:\n{pa.stderr}\n{pb.stderr}")
    same("fsc-consolidate", ["out.safetensors"], ["out.safetensors"], "no shard files given")
    print("ok  fsc-consolidate: --dir=D and --dir D (before or after OUT) the same")


def tokenize():
    text = os.path.join(TMP, "t.txt")
    with open(text, "w") as f:
        f.write("hello world, " * 200)
    for argv, prefix in ((["--tokenizer=bytes", "--val-fraction=0.2", "--output=eq"], "eq"),
                         (["--tokenizer", "bytes", "--val-fraction", "0.2", "-o", "sep"], "sep")):
        p = run("fsc-tokenize", *argv, text)
        if p.returncode != 0:
            fail(f"fsc-tokenize {argv}: exit {p.returncode}:\n{p.stderr}")
    for split in ("train", "val"):
        if digest(os.path.join(TMP, f"eq_{split}_000000.bin")) != \
                digest(os.path.join(TMP, f"sep_{split}_000000.bin")):
            fail(f"fsc-tokenize: the {split} shards of the two forms differ")
    print("ok  fsc-tokenize: the same shards from --flag=value and --flag value")


if __name__ == "__main__":
    checks = {"fsc-train": train, "fsc-bench": bench, "fsc-sample": sample, "fsc-plot": plot,
              "fsc-consolidate": consolidate, "fsc-tokenize": tokenize}
    for tool in TOOLS:
        if tool not in checks:
            fail(f"no checks for {tool}: add them here")
        common_behaviour(tool)
        checks[tool]()
