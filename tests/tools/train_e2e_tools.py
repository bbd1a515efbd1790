"""fsc-train end to end with the tools around it: --config files, fsc-sample on what
it saved, fsc-plot on its metrics."""
import json
import math
import os
import subprocess
import sys

from train_e2e_common import FSC_TRAIN, TINY, TMP, expect_refused, metrics, mpiexec, run


def strip_metadata(src, dst):
    """A Hugging Face style copy of a safetensors file: the same tensors, no __metadata__."""
    import struct
    raw = open(src, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    hb = json.dumps(header).encode()
    open(dst, "wb").write(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])


def config():
    """--config holds flags (the command line overrides); a checkpoint keeps the effective
    flags, so --resume with no model flags continues the run with the losses of an uninterrupted
    one (metrics appended), at another world size with the global batch kept; a resume that
    changes the model, the schedule or the global batch is refused naming the flag;
    --save writes Hugging Face's config.json, and --init-from takes the model from the file."""
    cfg = os.path.join(TMP, "run.json")
    json.dump({"layers": 2, "d_model": 64, "heads": 4, "seq": 32, "batch": 4, "steps": 8,
               "lr": 2e-3, "warmup": 2, "dropout": 0.1, "quiet": True}, open(cfg, "w"))
    full = os.path.join(TMP, "full.jsonl")
    run("--config", cfg, "--metrics", full)
    ref = [r["loss"] for r in metrics(full)]
    assert len(ref) == 8, ref
    short = os.path.join(TMP, "short.jsonl")
    run("--config", cfg, "--steps", "3", "--metrics", short)
    if len(metrics(short)) != 3:
        sys.exit("FAIL: --steps on the command line did not override --config's")
    # interrupted after the checkpoint at step 4 (the process exits before step 5)
    ck = os.path.join(TMP, "ck")
    m = os.path.join(TMP, "resumed.jsonl")
    env = dict(os.environ, FSC_FAULT="exit@0:5")
    p = subprocess.run([FSC_TRAIN, "--config", cfg, "--checkpoint-dir", ck, "--save-every", "4",
                        "--metrics", m], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 3 and len(metrics(m)) == 4, (p.returncode, p.stderr)
    # no model flags, no schedule, no --config; --save-every 0: the later resumes start at step 4
    p = run("--resume", ck, "--metrics", m, "--save-every", "0")
    got = [r["loss"] for r in metrics(m)]
    if [r["step"] for r in metrics(m)] != list(range(1, 9)):
        sys.exit(f"FAIL: --resume did not append steps 5-8 to the metrics: {got}")
    rel = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    print(f"--resume without flags: {' '.join(f'{v:.5f}' for v in got)} (max rel {rel:.1e})")
    print("   " + next(l for l in p.stderr.splitlines() if "from the checkpoint" in l))
    if rel > 1e-6:  # measured 0 (bit for bit) under Haswell and SkylakeX; 1e-6 ~ 10 ulps
        sys.exit(f"FAIL: the resumed run's losses differ from the uninterrupted run's ({rel:.2e})")
    # two ranks, no --batch: 2 per rank keeps the global batch of 4
    m2 = os.path.join(TMP, "resumed2.jsonl")
    p = mpiexec(2, "--strategy", "ddp", "--resume", ck, "--metrics", m2, "--save-every", "0")
    rel = max(abs(r["loss"] - b) / abs(b) for r, b in zip(metrics(m2), ref[4:]))
    # measured max rel 2.1e-7 (Haswell), 0 (SkylakeX): 48x headroom
    if "--batch 2 per rank keeps the global batch" not in p.stderr or rel > 1e-5:
        sys.exit(f"FAIL: resuming with 2 ranks: rel {rel:.2e}\n{p.stderr}")
    print(f"ok  2 ranks, --batch 2 taken to keep the global batch: max rel {rel:.1e}")
    for args, needles in ((["--layers", "3"], ["another model", "--layers 2 there, 3 given"]),
                          (["--lr", "1e-3"], ["--lr 0.002 -> 0.001", "--allow-change"]),
                          (["--steps", "20"], ["--steps 8 -> 20", "--allow-change"]),
                          (["--batch", "3"], ["global batch is 4", "--batch 3"])):
        p = run("--resume", ck, "--quiet", *args, expect_ok=False)
        if p.returncode == 0 or not all(n in p.stderr for n in needles):
            sys.exit(f"FAIL: --resume {args}: exit {p.returncode}, expected {needles}:\n{p.stderr}")
        print(f"ok  --resume {' '.join(args):12s} -> {p.stderr.strip().splitlines()[-1][:150]}")
    run("--resume", ck, "--quiet", "--steps", "10", "--lr", "1e-3", "--allow-change")
    bad = os.path.join(TMP, "bad.json")
    for text, needle in (('{"layerz": 2}', '"layerz" is not a flag'), ("[1, 2]", "not a JSON object"),
                         ('{"steps": "x"}', '--steps: "x" is not a valid integer')):
        open(bad, "w").write(text)
        p = run("--config", bad, expect_ok=False)
        if p.returncode == 0 or needle not in p.stderr or bad not in p.stderr:
            sys.exit(f"FAIL: --config {text}: exit {p.returncode}:\n{p.stderr}")
        print(f"ok  --config {text:18s} -> {p.stderr.strip().splitlines()[-1][:110]}")
    # --save writes config.json; --init-from takes the model from metadata, config.json, shapes
    out = os.path.join(TMP, "out")
    os.mkdir(out)
    w = os.path.join(out, "model.safetensors")
    run("--config", cfg, "--save", w)
    hf = json.load(open(os.path.join(out, "config.json")))
    want = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 32,
            "vocab_size": 256}
    if any(hf.get(k) != v for k, v in want.items()):
        sys.exit(f"FAIL: config.json beside --save: {hf}")
    print("ok  config.json beside --save:", {k: hf[k] for k in want})
    bare = os.path.join(TMP, "bare")
    os.mkdir(bare)
    strip_metadata(w, os.path.join(bare, "model.safetensors"))
    losses = {}
    for what, path, extra in (("metadata", w, []),
                              ("config.json", os.path.join(bare, "model.safetensors"), []),
                              ("shapes", os.path.join(bare, "model.safetensors"), ["--heads", "4"])):
        if what == "config.json":
            open(os.path.join(bare, "config.json"), "w").write(json.dumps(hf))
        if what == "shapes":
            os.remove(os.path.join(bare, "config.json"))
            p = run("--init-from", path, "--steps", "1", expect_ok=False)
            expect_refused(p, "give --heads", "--init-from without heads anywhere")
        mi = os.path.join(TMP, f"init-{what}.jsonl")
        p = run("--init-from", path, "--steps", "1", "--lr", "0", "--batch", "4", "--metrics", mi,
                *extra)
        losses[what] = metrics(mi)[0]["loss"]
        said = {"metadata": "its metadata", "config.json": "config.json beside it",
                "shapes": "its tensor shapes"}[what]
        if f"--init-from: from {said}" not in p.stderr:
            sys.exit(f"FAIL: --init-from did not say where the model came from:\n{p.stderr}")
    if len(set(losses.values())) != 1:
        sys.exit(f"FAIL: --init-from gave other losses by source: {losses}")
    print(f"ok  --init-from with no model flags (metadata, config.json, shapes): loss {losses}")
    # MoE: experts over 2 ranks checkpoint (their optimizer state by global name) and resume
    # to the uninterrupted losses; config.json records the MoE settings, so --init-from and
    # --resume rebuild the model with no --moe-* flags; another --moe-experts is refused
    moe = ["--moe-experts", "4", "--moe-every", "1", "--moe-capacity", "1.5", "--moe-aux-coef",
           "0.02", "--moe-hidden", "96"]
    mout = os.path.join(TMP, "moe")
    os.mkdir(mout)
    mw, mck = os.path.join(mout, "model.safetensors"), os.path.join(TMP, "moe-ck")
    mfull, mres = os.path.join(TMP, "moe-full.jsonl"), os.path.join(TMP, "moe-res.jsonl")
    mpiexec(2, "--config", cfg, "--strategy", "ddp", *moe, "--save", mw, "--metrics", mfull,
            "--checkpoint-dir", mck, "--save-every", "4")
    step4 = sorted(d for d in os.listdir(mck) if d != "latest" and "4" in d)[0]
    p = mpiexec(2, "--resume", os.path.join(mck, step4), "--metrics", mres, "--save-every", "0")
    full, res = [r["loss"] for r in metrics(mfull)], [r["loss"] for r in metrics(mres)]
    if res != full[4:]:
        sys.exit(f"FAIL: MoE resume on 2 ranks: {res} vs uninterrupted {full[4:]}\n{p.stderr}")
    print(f"ok  MoE over 2 ranks resumed at step 4: losses {res} as uninterrupted")
    hf = json.load(open(os.path.join(mout, "config.json")))
    want = {"num_experts": 4, "decoder_sparse_step": 1, "moe_intermediate_size": 96,
            "moe_capacity_factor": 1.5, "router_aux_loss_coef": 0.02, "num_experts_per_tok": 2}
    if any(hf.get(k) != v for k, v in want.items()):
        sys.exit(f"FAIL: MoE config.json beside --save: {hf}")
    mi = [os.path.join(TMP, f"moe-init{i}.jsonl") for i in range(2)]
    run("--init-from", mw, "--steps", "1", "--lr", "0", "--batch", "4", "--metrics", mi[0], *moe)
    p = run("--init-from", mw, "--steps", "1", "--lr", "0", "--batch", "4", "--metrics", mi[1])
    if "--moe-experts 4" not in p.stderr or "--moe-capacity 1.5" not in p.stderr or \
            metrics(mi[0])[0]["loss"] != metrics(mi[1])[0]["loss"]:
        sys.exit(f"FAIL: --init-from an MoE model without --moe-* flags:\n{p.stderr}")
    p = run("--resume", mck, "--quiet", "--moe-experts", "2", expect_ok=False)
    expect_refused(p, "--moe-experts 4 there, 2 given", "--resume with another --moe-experts")
    print("ok  config.json records the MoE settings; --init-from takes them:",
          {k: hf[k] for k in want})


def sample():
    """fsc-sample: reproducible by seed, the same tokens with and without the KV cache, the
    same text from the weights file, the checkpoint and a Hugging Face style copy of it (no
    metadata, "transformer." names, an extra lm_head); GPT-2 BPE when its files are there."""
    import struct
    fsc_sample = os.path.join(os.path.dirname(FSC_TRAIN), "fsc-sample")
    w, ck = os.path.join(TMP, "w.safetensors"), os.path.join(TMP, "ck")
    run("--layers", "2", "--d-model", "64", "--heads", "4", "--seq", "32", "--batch", "8",
        "--steps", "40", "--lr", "3e-3", "--save", w, "--checkpoint-dir", ck, "--save-every", "40",
        "--quiet")

    def gen(*args, expect_ok=True):
        p = subprocess.run([fsc_sample, *map(str, args)], capture_output=True, text=True,
                           timeout=300)
        if p.returncode < 0 or (expect_ok and p.returncode != 0):
            sys.exit(f"FAIL: fsc-sample {' '.join(map(str, args))} exited {p.returncode}:\n"
                     f"{p.stderr}")
        return p
    args = ["--prompt", "The ", "--max-new-tokens", "80", "--seed", "5", "--top-k", "20"]
    a = gen("--model", w, *args)
    if a.stdout != gen("--model", w, *args).stdout:
        sys.exit("FAIL: the same seed gave other text")
    if a.stdout != gen("--model", w, *args, "--no-kv-cache").stdout:
        sys.exit("FAIL: the KV cache changed the tokens drawn")
    if a.stdout == gen("--model", w, *args[:-3], "6", "--top-k", "20").stdout:
        sys.exit("FAIL: another seed gave the same text")
    if a.stdout != gen("--model", ck, *args).stdout:
        sys.exit("FAIL: the checkpoint gave other text than the weights file")
    speed = lambda p: p.stderr.strip().splitlines()[-1]
    print("ok  seed 5: reproducible, == --no-kv-cache, == from the checkpoint:",
          repr(a.stdout[:60]))
    print("   ", speed(a))
    # a Mixture-of-Experts model: its experts, spacing and width read from the file
    # (a dense model would not load its tensors); sampled with no capacity limit, so the
    # KV cache and a full forward per token route alike and draw the same ids
    mw, mck = os.path.join(TMP, "moe", "w.safetensors"), os.path.join(TMP, "moe-ck")
    os.makedirs(os.path.dirname(mw), exist_ok=True)
    run("--layers", "2", "--d-model", "64", "--heads", "4", "--seq", "32", "--batch", "8",
        "--steps", "4", "--moe-experts", "4", "--moe-every", "1", "--moe-hidden", "96",
        "--save", mw, "--checkpoint-dir", mck, "--save-every", "4", "--quiet")
    margs = [*args, "--ids"]  # ids: a barely trained model's bytes need not be UTF-8
    m = gen("--model", mw, *margs)
    if "Mixture of Experts: 4 experts in 2 of 2 blocks, no capacity limit" not in m.stderr:
        sys.exit(f"FAIL: no note of the MoE model and its capacity:\n{m.stderr}")
    if m.stdout != gen("--model", mw, *margs, "--no-kv-cache").stdout:
        sys.exit("FAIL: the KV cache changed the MoE model's ids")
    if m.stdout != gen("--model", mw, *margs).stdout or \
            m.stdout != gen("--model", mck, *margs).stdout:
        sys.exit("FAIL: the MoE model's text is not reproducible, or differs from its checkpoint")
    print("ok  an MoE model samples, the same with and without the KV cache and from its "
          "checkpoint")
    # a Hugging Face style file: no metadata, "transformer." prefix, an unused lm_head
    raw = open(w, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    header = {"transformer." + k: v for k, v in header.items()}
    end = max(v["data_offsets"][1] for v in header.values())
    wte = header["transformer.wte.weight"]
    header["lm_head.weight"] = dict(wte, data_offsets=[end, end + wte["data_offsets"][1]
                                                       - wte["data_offsets"][0]])
    blob = raw[8 + n:] + raw[8 + n:][wte["data_offsets"][0]:wte["data_offsets"][1]]
    hb = json.dumps(header).encode()
    hf = os.path.join(TMP, "hf.safetensors")
    open(hf, "wb").write(struct.pack("<Q", len(hb)) + hb + blob)
    if a.stdout != gen("--model", hf, "--heads", "4", *args).stdout:
        sys.exit("FAIL: the Hugging Face style copy gave other text")
    print("ok  a Hugging Face style copy (no metadata, --heads 4) gives the same text")
    for bad, needle in ((["--model", "/nonexistent"], "/nonexistent"),
                        (["--model", w, "--prompt-ids", "999"], "--prompt-ids"),
                        (["--model", w, "--top-k", "x"], "--top-k"),
                        (["--prompt", "x"], "--model PATH is required")):
        p = gen(*bad, expect_ok=False)
        expect_refused(p, needle, f"fsc-sample {bad}")
        print(f"ok  fsc-sample {' '.join(bad)[:40]:40s} -> {p.stderr.strip()[:90]}")
    bpe = os.environ.get("FSC_GPT2_BPE_DIR", os.path.expanduser("~/.cache/fsc/gpt2"))
    if not os.path.exists(os.path.join(bpe, "vocab.bpe")):
        print("SKIP: GPT-2's BPE files are not there (scripts/fetch_gpt2_bpe.sh): no BPE part")
        return
    text = os.path.join(TMP, "english.txt")
    open(text, "w").write("The cat sat on the mat. It's a sunny day, isn't it?\n" * 200)
    wb = os.path.join(TMP, "bpe.safetensors")
    p = run("--layers", "1", "--d-model", "32", "--heads", "2", "--seq", "32", "--batch", "4",
            "--steps", "30", "--lr", "1e-2", "--tokenizer", bpe, "--data", text, "--save", wb)
    print("ok  fsc-train --tokenizer:", next(l for l in p.stderr.splitlines() if "BPE" in l))
    g = gen("--model", wb, "--tokenizer", bpe, "--prompt", "The cat", "--max-new-tokens", "20",
            "--temperature", "0")
    if not g.stdout.startswith("The cat") or "sat" not in g.stdout:
        sys.exit(f"FAIL: greedy text from a model trained on one sentence: {g.stdout!r}")
    print(f"ok  BPE in and out, greedy: {g.stdout.strip()[:70]!r}")


def plot():
    """fsc-plot: a well formed SVG with one line per series per file, val points where the
    rows have them, a legend naming every file; empty and missing files refused by name."""
    import xml.etree.ElementTree as ET
    fsc_plot = os.path.join(os.path.dirname(FSC_TRAIN), "fsc-plot")
    a, b = os.path.join(TMP, "a.jsonl"), os.path.join(TMP, "b & <c>.jsonl")
    run(*TINY, "--steps", "20", "--lr", "3e-3", "--eval-every", "5", "--eval-batches", "1",
        "--metrics", a, "--quiet")
    rows = metrics(a)
    nval = sum("val_loss" in r for r in rows)
    if nval < 4:
        sys.exit(f"FAIL: expected val_loss in 4+ of the rows of {a}, found {nval}")
    # the second run: another loss, no val, a NaN loss as C prints it, a torn last line
    with open(b, "w") as f:
        for r in rows:
            f.write(json.dumps({"step": r["step"], "loss": r["loss"] + 0.5, "lr": r["lr"],
                                "tokens_per_s": r["tokens_per_s"]}) + "\n")
        f.write('{"step": 21, "loss": nan, "lr": 1e-4, "tokens_per_s": 100.0}\n{"step": 2')

    def plot_(*args, expect_ok=True):
        p = subprocess.run([fsc_plot, *args], capture_output=True, text=True, timeout=120)
        if p.returncode < 0 or (expect_ok and p.returncode != 0):
            sys.exit(f"FAIL: fsc-plot {' '.join(args)} exited {p.returncode}:\n{p.stderr}")
        return p

    def polylines(root, cls):
        ns = "{http://www.w3.org/2000/svg}"
        return [e for e in root.iter(ns + "polyline") if e.get("class") == cls]
    for files in ([a], [a, b]):
        svg = os.path.join(TMP, f"curve{len(files)}.svg")
        plot_(*files, "-o", svg)
        root = ET.parse(svg).getroot()  # raises on malformed XML
        ns = "{http://www.w3.org/2000/svg}"
        for cls in ("loss", "lr", "tokens_per_s"):
            got = sorted(e.get("data-file") for e in polylines(root, cls))
            if got != [str(i) for i in range(len(files))]:
                sys.exit(f"FAIL: {files}: polylines of {cls} for files {got}")
            for e in polylines(root, cls):
                if len(e.get("points").split()) < 10:
                    sys.exit(f"FAIL: {cls} of file {e.get('data-file')}: {e.get('points')!r}")
        val = [e for e in root.iter(ns + "circle") if e.get("class") == "val_loss"]
        if len(val) != nval or any(e.get("data-file") != "0" for e in val):
            sys.exit(f"FAIL: {len(val)} val points, expected {nval}, all of file 0")
        legend = " ".join("".join(t.itertext()) for g in root.iter(ns + "g")
                          if g.get("class") == "legend" for t in g.iter(ns + "text"))
        if any(f not in legend for f in files):
            sys.exit(f"FAIL: the legend does not name {files}: {legend!r}")
        print(f"ok  fsc-plot {len(files)} file(s): well formed, 3 lines per file, {len(val)} "
              f"val points, legend names them")
    # --smooth: the average is smoother than the raw line, drawn faint under it; --log-y:
    # the loss ticks sit at equal pixels per decade; the key explains lines and points
    svg = os.path.join(TMP, "smooth.svg")
    plot_(a, b, "-o", svg, "--smooth", "0.9", "--log-y")
    root = ET.parse(svg).getroot()
    ns = "{http://www.w3.org/2000/svg}"

    def wiggle(e):  # total vertical travel of a polyline, in pixels
        ys = [float(p.split(",")[1]) for p in e.get("points").split()]
        return sum(abs(y1 - y0) for y0, y1 in zip(ys, ys[1:]))
    raw, smooth = polylines(root, "loss"), polylines(root, "loss_smooth")
    if len(smooth) != 2 or any(e.get("stroke-opacity") is None for e in raw):
        sys.exit(f"FAIL: --smooth: {len(smooth)} averaged lines for 2 files, raw lines faint: "
                 f"{[e.get('stroke-opacity') for e in raw]}")
    for r_, s_ in zip(raw, smooth):
        if not wiggle(s_) < wiggle(r_):
            sys.exit(f"FAIL: --smooth: the average moves {wiggle(s_):.1f} px, the raw loss "
                     f"{wiggle(r_):.1f} px")
    loss_panel = next(g for g in root.iter(ns + "g") if g.get("id") == "panel-loss")
    ticks = [(float(t.text), float(t.get("y"))) for t in loss_panel.iter(ns + "text")
             if t.get("class") == "ytick"]
    per_decade = [(y0 - y1) / (math.log10(v1) - math.log10(v0))
                  for (v0, y0), (v1, y1) in zip(ticks, ticks[1:])]
    # (pixels are rounded to 0.1; a linear axis would differ by the ticks' ratio, here >= 1.1)
    if len(ticks) < 3 or max(per_decade) > 1.01 * min(per_decade):
        sys.exit(f"FAIL: --log-y: loss ticks {ticks} are not evenly spaced per decade")
    key = " ".join("".join(t.itertext()) for g in root.iter(ns + "g") if g.get("class") == "key"
                   for t in g.iter(ns + "text"))
    if "val loss" not in key or "smoothed" not in key:
        sys.exit(f"FAIL: the legend's key {key!r} does not name the marks")
    p = plot_(a, "-o", svg, "--smooth", "1", expect_ok=False)
    if p.returncode != 2 or "--smooth" not in p.stderr:
        sys.exit(f"FAIL: --smooth 1: exit {p.returncode}: {p.stderr}")
    print(f"ok  fsc-plot --smooth 0.9 --log-y: averages {wiggle(smooth[0]):.0f} px of travel vs "
          f"{wiggle(raw[0]):.0f} raw, {len(ticks)} log ticks, the key names the marks; "
          f"--smooth 1 refused")
    empty = os.path.join(TMP, "empty.jsonl")
    open(empty, "w").close()
    for files, needle in (([a, empty], empty), ([a, "/nonexistent/m.jsonl"],
                                                  "/nonexistent/m.jsonl")):
        out = os.path.join(TMP, "refused.svg")
        p = plot_(*files, "-o", out, expect_ok=False)
        if p.returncode == 0 or needle not in p.stderr or os.path.exists(out):
            sys.exit(f"FAIL: fsc-plot {files}: exit {p.returncode}, expected {needle!r} in:\n"
                     f"{p.stderr}")
        print(f"ok  refused: {p.stderr.strip()}")
