"""fsc-train and its tools as a new user meets them (issue 28): a resumed run keeps
saving where the run it continues saved; under a launcher the default strategy is
one that spans the ranks, and a refusal is said once; fsc-sample never feeds a
GPT-2-sized model bytes; mistakes get a hint, and a prefix is never said twice."""
import os
import shutil
import subprocess
import sys

from train_e2e_common import FSC_TRAIN, TINY, TMP, expect_refused, metrics, mpiexec, run

TOOLS = os.path.dirname(FSC_TRAIN)


def resume_outputs():
    """--resume DIR alone, twice: each segment writes its checkpoints into the first run's
    --checkpoint-dir (pruned by its --keep-last), appends its rows to its --metrics and
    rewrites its --save; a flag given on the command line still wins. The echo of the
    taken flags prints each number as its shortest text (--lr 0.003)."""
    ck, m = os.path.join(TMP, "out-ck"), os.path.join(TMP, "out.jsonl")
    w, csv_path = os.path.join(TMP, "out.safetensors"), os.path.join(TMP, "out.csv")
    run(*TINY, "--steps", "4", "--lr", "0.003", "--schedule", "constant", "--checkpoint-dir", ck,
        "--save-every", "2", "--keep-last", "4", "--metrics", m, "--metrics-csv", csv_path,
        "--save", w, "--quiet")
    os.remove(w)
    p = run("--resume", ck, "--steps", "8")
    taken = next((l for l in p.stderr.splitlines() if "from the checkpoint" in l), "")
    print("   " + taken)
    for flag in ("--checkpoint-dir", "--save-every 2", "--keep-last 4", "--metrics", "--save",
                 "--lr 0.003 "):
        if flag not in taken + " ":
            sys.exit(f"FAIL: the resume did not take {flag.strip()} from the checkpoint:\n"
                     f"{p.stderr}")
    if "0.0030000000000000001" in p.stderr:
        sys.exit(f"FAIL: the echo prints --lr as %.17g does:\n{taken}")
    if not os.path.exists(w):
        sys.exit("FAIL: the resumed run did not write the first run's --save")
    run("--resume", ck, "--steps", "12", "--quiet")
    steps = sorted(d for d in os.listdir(ck) if d.startswith("step-"))
    want = [f"step-{s:06d}" for s in (6, 8, 10, 12)]
    if steps != want:
        sys.exit(f"FAIL: checkpoints of the three segments: {steps}, expected {want} "
                 "(--save-every 2, --keep-last 4)")
    rows = [r["step"] for r in metrics(m)]
    if rows != list(range(1, 13)):
        sys.exit(f"FAIL: the metrics rows of the three segments: steps {rows}, expected 1-12")
    print(f"ok  --resume alone, twice: checkpoints {steps}; metrics steps 1-12 in one file")
    # the CSV sibling: one header, then the JSON rows' values, segment after segment
    import csv
    with open(csv_path, newline="") as f:
        table = list(csv.DictReader(f))
    with open(csv_path) as f:
        headers = sum(line.startswith("step,") for line in f)
    json_rows = metrics(m)
    if headers != 1 or [int(r["step"]) for r in table] != rows or any(
            abs(float(c["loss"]) - j["loss"]) > 1e-6 or abs(float(c["lr"]) - j["lr"]) > 1e-9 or
            c["val_loss"] != "" for c, j in zip(table, json_rows)):
        sys.exit(f"FAIL: --metrics-csv: {headers} header(s), steps {[r['step'] for r in table]}, "
                 f"expected one header and the JSON rows' steps and losses")
    print(f"ok  --metrics-csv: one header, {len(table)} rows equal to the JSON rows, kept by "
          "--resume")
    other = os.path.join(TMP, "other.jsonl")
    run("--resume", ck, "--steps", "13", "--metrics", other, "--save-every", "0", "--quiet")
    if [r["step"] for r in metrics(other)] != [13] or len(metrics(m)) != 12:
        sys.exit("FAIL: --metrics given with --resume did not win over the checkpoint's")
    print("ok  --metrics given with --resume wins over the checkpoint's")


def keep_best():
    """--keep-best 2 --keep-last 1: a checkpoint after every evaluation, and the directory
    keeps the two of lowest val loss (as the metrics rows report it) and the newest; a
    resume adds its own to the same ranking; without --eval-every it is refused."""
    ck, m = os.path.join(TMP, "best-ck"), os.path.join(TMP, "best.jsonl")
    common = ("--eval-every", "2", "--eval-batches", "1", "--val-fraction", "0.2",
              "--lr", "0.01", "--schedule", "constant", "--checkpoint-dir", ck, "--keep-best", "2",
              "--keep-last", "1",
              "--metrics", m, "--quiet")
    run(*TINY, "--steps", "10", *common)
    run("--resume", ck, "--steps", "16", "--quiet")

    def expect():
        val = {r["step"]: r["val_loss"] for r in metrics(m) if "val_loss" in r}
        best = sorted(val, key=lambda s: (val[s], s))[:2]
        return val, sorted({*best, max(val)})
    val, want = expect()
    got = sorted(int(d[5:]) for d in os.listdir(ck) if d.startswith("step-"))
    if len(val) != 8 or got != want:
        sys.exit(f"FAIL: --keep-best 2 --keep-last 1: kept steps {got}, expected {want} "
                 f"(val losses by step {val})")
    print(f"ok  --keep-best 2 --keep-last 1 over two segments: kept {got} of 8 evaluations "
          f"({', '.join(f'{s}: {val[s]:.4f}' for s in got)})")
    p = run(*TINY, "--steps", "2", "--checkpoint-dir", ck + "2", "--keep-best", "1",
            expect_ok=False)
    expect_refused(p, "--keep-best needs --checkpoint-dir and --eval-every", "--keep-best alone")


def launcher():
    """mpiexec -n 2 without --strategy trains under ddp and says so in the header line, and
    its checkpoints resume with --resume alone on 2 ranks (rank 0 alone appends the metrics);
    a refusal found by every rank is printed once."""
    m, ck = os.path.join(TMP, "launch.jsonl"), os.path.join(TMP, "launch-ck")
    p = mpiexec(2, *TINY, "--steps", "2", "--metrics", m, "--checkpoint-dir", ck,
                "--save-every", "2")
    header = next((l for l in p.stderr.splitlines() if "tokens/step" in l), "")
    if "ddp (the default with more than one rank) on 2 ranks" not in header:
        sys.exit(f"FAIL: no ddp default in the header line:\n{p.stderr}")
    print("ok  2 ranks, no --strategy:", header[header.index("ddp"):][:60])
    mpiexec(2, "--resume", ck, "--steps", "4", "--quiet")
    if [r["step"] for r in metrics(m)] != [1, 2, 3, 4] or \
            sorted(os.listdir(ck)) != ["latest", "step-000002", "step-000004"]:
        sys.exit(f"FAIL: 2 ranks resumed alone: metrics steps {[r['step'] for r in metrics(m)]}, "
                 f"checkpoints {sorted(os.listdir(ck))}")
    print("ok  2 ranks, --resume alone: checkpoint at step 4, metrics rows 1-4 once each")
    p = mpiexec(2, *TINY, "--steps", "2", "--strategy", "single", expect_ok=False)
    expect_refused(p, "--strategy single runs in one process", "single under mpiexec")
    said = p.stderr.count("--strategy single runs in one process")
    if said != 1:
        sys.exit(f"FAIL: the refusal was printed {said} times:\n{p.stderr}")
    p = mpiexec(2, *TINY, "--steps", "2", "--save-every", "1", expect_ok=False)
    if p.stderr.count("--save-every needs --checkpoint-dir") != 1:
        sys.exit(f"FAIL: a flag refusal under mpiexec is not printed once:\n{p.stderr}")
    print("ok  refusals under mpiexec are printed once")
    # found after start-up by every rank (the shard's header, the held-out data): one line
    bad = os.path.join(TMP, "bad-shard.bin")
    open(bad, "wb").write(b"not an llm.c shard")
    for extra, what in ((["--data", bad], "--data"), (["--eval-every", "1", "--val-data", bad],
                                                      "--val-data")):
        p = mpiexec(2, *TINY, "--steps", "2", "--vocab", "256", *extra, expect_ok=False)
        said = p.stderr.count("too short for the 1024-byte llm.c shard header")
        lines = [l for l in p.stderr.splitlines() if l.startswith("fsc-train:")]
        if p.returncode == 0 or said != 1 or len(lines) != 1:
            sys.exit(f"FAIL: a bad {what} shard under mpiexec, found by both ranks after "
                     f"start-up: exit {p.returncode}, said {said} times:\n{p.stderr}")
        print(f"ok  a bad {what} shard on 2 ranks is one line:", lines[0][:100])


def sample_tokenizer():
    """A 50,257-token model is not given a prompt as bytes: without --tokenizer fsc-sample
    refuses and says what to pass; with GPT-2's BPE files beside the model it uses them."""
    sample = os.path.join(TOOLS, "fsc-sample")
    d = os.path.join(TMP, "gpt2-sized")
    os.mkdir(d)
    w = os.path.join(d, "model.safetensors")
    run("--layers", "1", "--d-model", "32", "--heads", "2", "--seq", "16", "--batch", "2",
        "--steps", "1", "--vocab", "50257", "--save", w, "--quiet")

    def gen(*args):
        return subprocess.run([sample, "--model", w, "--max-new-tokens", "3", *args],
                              capture_output=True, text=True, timeout=300)
    for args in (["--prompt", "Hello"], []):
        p = gen(*args)
        expect_refused(p, "--tokenizer DIR", f"fsc-sample {args} without --tokenizer")
        if "--prompt-ids" not in p.stderr:
            sys.exit(f"FAIL: the refusal does not name --prompt-ids:\n{p.stderr}")
    print("ok  fsc-sample, 50257 tokens, no --tokenizer ->", p.stderr.strip()[:110])
    p = gen("--prompt-ids", "464,3290", "--ids", "--quiet")
    if p.returncode != 0 or len(p.stdout.split()) != 3:
        sys.exit(f"FAIL: --prompt-ids with --ids: exit {p.returncode}:\n{p.stdout}{p.stderr}")
    print("ok  --prompt-ids with --ids: ids in, ids out")
    bpe = os.environ.get("FSC_GPT2_BPE_DIR", os.path.expanduser("~/.cache/fsc/gpt2"))
    if not os.path.exists(os.path.join(bpe, "vocab.bpe")):
        print("SKIP: GPT-2's BPE files are not there (scripts/fetch_gpt2_bpe.sh): none beside")
        return
    for f in ("encoder.json", "vocab.bpe"):
        shutil.copy(os.path.join(bpe, f), d)
    p = gen("--prompt", "Hello")
    if p.returncode != 0 or "beside the model" not in p.stderr:
        sys.exit(f"FAIL: the BPE files beside the model were not used:\n{p.stderr}")
    print("ok  the BPE files beside the model are taken:", p.stderr.splitlines()[0])


def messages():
    """An unknown --config key gets the command line's hint; "(see --help)" is said once;
    --help says bf16 runs under every strategy; fsc-tokenize names the script that fetches
    GPT-2's files, not install-deps.sh."""
    cfg = os.path.join(TMP, "typo.json")
    for key in ("lay", "layres", "d_modle"):
        open(cfg, "w").write('{"%s": 2}' % key)
        p = run("--config", cfg, expect_ok=False)
        want = "layers" if key != "d_modle" else "d-model"
        expect_refused(p, f'(did you mean "{want}"?)', f"--config key {key!r}")
        if p.stderr.count("(see --help)") > 1:
            sys.exit(f"FAIL: doubled '(see --help)':\n{p.stderr}")
        print(f"ok  --config {{{key!r}: 2}} ->", p.stderr.strip()[:110])
    p = run("--bogus", expect_ok=False)
    if p.stderr.count("(see --help)") != 1:
        sys.exit(f"FAIL: '(see --help)' is not said once:\n{p.stderr}")
    help_text = run("--help").stdout
    line = next(l for l in help_text.splitlines() if "--mixed-precision" in l)
    if "fsdp: fp32 | bf16" in line or "every strategy" not in line:
        sys.exit(f"FAIL: --help still says --mixed-precision is fsdp-only: {line}")
    print("ok  --help:", line.strip()[:100])
    text = os.path.join(TMP, "t.txt")
    open(text, "w").write("hello\n")
    p = subprocess.run([os.path.join(TOOLS, "fsc-tokenize"), "-o", os.path.join(TMP, "tok"),
                        "--tokenizer", os.path.join(TMP, "no-bpe-here"), text],
                       capture_output=True, text=True, timeout=60)
    expect_refused(p, "fetch_gpt2_bpe.sh", "fsc-tokenize without BPE files")
    if "install-deps.sh" in p.stderr:
        sys.exit(f"FAIL: fsc-tokenize says install-deps.sh fetches the BPE files:\n{p.stderr}")
    print("ok  fsc-tokenize without BPE files names scripts/fetch_gpt2_bpe.sh only")


def vocab_mfu():
    """Friction 8: --vocab left out is taken from the shards' header (word 3, which
    fsc-tokenize writes) or else the largest token id in the data, and a given --vocab smaller
    than either is refused naming both numbers; FSC_PEAK_GFLOPS fixes the peak that MFU is a
    share of, and the summary says which peak it used. fsc-tokenize makes -o's directories
    (friction list, item 5) and records the vocabulary in the header."""
    import re
    import struct
    from train_e2e_data import write_shard
    d = os.path.join(TMP, "vocab")
    os.makedirs(d)
    tok = [(i * 7 + i // 3) % 250 for i in range(3000)]
    declared = os.path.join(d, "decl_train_000000.bin")
    with open(declared, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tok), 300, *([0] * 252)))
        f.write(struct.pack(f"<{len(tok)}H", *tok))
    small = ["--layers", "1", "--d-model", "16", "--heads", "2", "--seq", "16", "--batch", "2",
             "--steps", "2"]
    save = os.path.join(d, "m.safetensors")
    p = run(*small, "--data", declared, "--save", save)
    config = __import__("json").load(open(os.path.join(d, "config.json")))
    if "--vocab 300, from the header of" not in p.stderr or config["vocab_size"] != 300:
        sys.exit(f"FAIL: --vocab not taken from the header (config.json vocab_size "
                 f"{config['vocab_size']}):\n{p.stderr}")
    print("ok  --vocab from the shard's header: 300 (config.json says so)")
    p = run(*small, "--data", declared, "--vocab", "256", expect_ok=False)
    expect_refused(p, "--vocab 256 is smaller than the 300-token vocabulary", "--vocab 256")
    print("ok  refused:", p.stderr.strip().splitlines()[-1][:110])
    plain = os.path.join(d, "plain.bin")
    write_shard(plain, tok[:5] + [411] + tok[6:])
    p = run(*small, "--data", plain)
    if "--vocab 412, from the largest token id in --data" not in p.stderr:
        sys.exit(f"FAIL: --vocab not taken from the largest id (411):\n{p.stderr}")
    p = run(*small, "--data", plain, "--vocab", "400", expect_ok=False)
    expect_refused(p, "has token ids up to 411 but --vocab is 400", "--vocab 400")
    print("ok  --vocab from the largest id: 412; --vocab 400 refused naming both")

    def throughput(env):
        q = subprocess.run([FSC_TRAIN, *small, "--steps", "3"], capture_output=True, text=True,
                           timeout=300, env={**os.environ, **env})
        line = next((l for l in q.stderr.splitlines() if l.startswith("throughput")), "")
        m = re.search(r"([\d.]+) model GFLOP/s = (\d+)% of (\d+) x ([\d.]+) GFLOP/s sgemm peak "
                      r"\((.*)\)", line)
        if q.returncode != 0 or not m:
            sys.exit(f"FAIL: no throughput line with its peak:\n{q.stderr}")
        return float(m[1]), int(m[2]), int(m[3]), float(m[4]), m[5], line
    gflops, share, cores, peak, source, line = throughput({"FSC_PEAK_GFLOPS": "40"})
    # the share is printed whole and the GFLOP/s to 0.1: 1 point covers both roundings
    if peak != 40 or source != "FSC_PEAK_GFLOPS" or abs(share - 100 * gflops / (
            40 * cores)) > 1:
        sys.exit(f"FAIL: MFU not against FSC_PEAK_GFLOPS=40: {line}")
    print("ok  FSC_PEAK_GFLOPS=40:", line[line.index("="):])
    if throughput({})[4] != "measured at start-up":
        sys.exit("FAIL: the summary does not say the peak was measured")
    bad = subprocess.run([FSC_TRAIN, *small], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "FSC_PEAK_GFLOPS": "fast"})
    expect_refused(bad, "FSC_PEAK_GFLOPS=fast: expected GFLOP/s per core", "FSC_PEAK_GFLOPS=fast")
    print("ok  FSC_PEAK_GFLOPS=fast refused at start-up")

    tokenize = os.path.join(TOOLS, "fsc-tokenize")
    text = os.path.join(d, "t.txt")
    open(text, "w").write("the cat sat on the mat\n" * 20)
    out = os.path.join(d, "new", "deeper", "book")
    q = subprocess.run([tokenize, "-o", out, "--tokenizer", "bytes", "--quiet", text],
                       capture_output=True, text=True, timeout=60)
    shard = out + "_train_000000.bin"
    if q.returncode != 0 or not os.path.exists(shard):
        sys.exit(f"FAIL: fsc-tokenize -o into a new directory: exit {q.returncode}:\n{q.stderr}")
    words = struct.unpack("<4i", open(shard, "rb").read(16))
    if words[3] != 256:
        sys.exit(f"FAIL: fsc-tokenize's header words {words}: expected the vocab 256 in word 3")
    print("ok  fsc-tokenize made", os.path.dirname(out), "and wrote vocab 256 in the header")
    q = subprocess.run([tokenize, "-o", os.path.join(declared, "x", "book"), "--tokenizer",
                        "bytes", text], capture_output=True, text=True, timeout=60)
    expect_refused(q, "is not a directory", "fsc-tokenize -o under a file")
    print("ok  refused:", q.stderr.strip()[:110])


def save_dir():
    """--save-dir DIR writes what from_pretrained reads: PyTorch's GPT-2 built from DIR's
    config.json and model.safetensors (tests/reference/hf_gpt2_dir.py) gives fsc-sample's
    logits within the float32 noise floor; GPT-2's encoder.json/vocab.bpe are copied as
    vocab.json/merges.txt; fsc-sample --model DIR --prompt works without --tokenizer."""
    try:
        import torch
    except ImportError:
        print("SKIP: no torch")
        sys.exit(77)
    import json
    import hf_gpt2_dir
    from torch_gpt import load_safetensors
    here = os.path.dirname(os.path.abspath(__file__))
    bpe = os.path.join(here, "..", "data", "bpe_tiny")
    d = os.path.join(TMP, "hf-gpt2")
    text = os.path.join(TMP, "sd.txt")
    open(text, "w").write("the cat sat on the mat. the dog ran to the cat!\n" * 200)
    p = run("--layers", "2", "--d-model", "32", "--heads", "2", "--seq", "16", "--batch", "2",
            "--steps", "3", "--data", text, "--tokenizer", bpe, "--save-dir", d)
    if "--save-dir" not in p.stderr or "the tokenizer from" not in p.stderr:
        sys.exit(f"FAIL: --save-dir did not report the tokenizer copied:\n{p.stderr}")
    vocab, merges = hf_gpt2_dir.tokenizer_files(d)
    if vocab != json.load(open(os.path.join(bpe, "encoder.json"))) or not merges or \
            open(os.path.join(d, "merges.txt")).read() != \
            open(os.path.join(bpe, "vocab.bpe")).read():
        sys.exit("FAIL: vocab.json/merges.txt are not GPT-2's encoder.json/vocab.bpe")
    prompt = [3, 70, 71, 200, 5, 99, 12]
    sample = os.path.join(TOOLS, "fsc-sample")
    out = os.path.join(TMP, "sd-logits.safetensors")
    q = subprocess.run([sample, "--model", d, "--prompt-ids", ",".join(map(str, prompt)),
                        "--max-new-tokens", "0", "--logits", out, "--quiet"],
                       capture_output=True, text=True, timeout=120)
    if q.returncode != 0:
        sys.exit(f"FAIL: fsc-sample --model {d} --logits: exit {q.returncode}:\n{q.stderr}")
    got = load_safetensors(out)[0]["logits"].double()
    x = torch.tensor([prompt])
    with torch.no_grad():
        ref64 = hf_gpt2_dir.read(d, torch.float64)[0](x)[0]
        ref32 = hf_gpt2_dir.read(d, torch.float32)[0](x)[0].double()
    e32 = (ref32 - ref64).abs().max().item()
    bound = max(8 * e32, 2 * 2.0 ** -23 * ref64.abs().max().item())  # hf_llama's noise floor
    err = (got - ref64).abs().max().item()
    if got.shape != ref64.shape or not err <= bound:
        sys.exit(f"FAIL: PyTorch's logits from {d} differ from fsc's by {err:.2e} > {bound:.2e}")
    print(f"ok  --save-dir read by PyTorch: logits within {err:.1e} of the float64 reference "
          f"(PyTorch float32 {e32:.1e}, bound {bound:.1e}); vocab.json/merges.txt copied")
    q = subprocess.run([sample, "--model", d, "--prompt", "the cat", "--max-new-tokens", "4"],
                       capture_output=True, text=True, errors="replace", timeout=120)
    if q.returncode != 0 or "beside the model" not in q.stderr or not q.stdout.startswith(
            "the cat"):
        sys.exit(f"FAIL: fsc-sample --model DIR --prompt without --tokenizer: exit "
                 f"{q.returncode}:\n{q.stdout}{q.stderr}")
    print("ok  fsc-sample --model DIR --prompt 'the cat' (no --tokenizer):",
          q.stderr.splitlines()[0])


def summary():
    """Friction 9: under --tp the summary's header names tp, a line gives the time in
    tensor-parallel collectives, and the peak memory is listed for every rank (each holds
    other slices); --balance auto names each stage apart in its line."""
    p = mpiexec(2, *TINY, "--steps", "2", "--tp", "2")
    head = next((l for l in p.stderr.splitlines() if "fsc-train summary" in l), "")
    ranks = [l for l in p.stderr.splitlines() if l.startswith("peak memory rank ")]
    if "x tp 2" not in head or "tp comm" not in p.stderr or len(ranks) != 2:
        sys.exit(f"FAIL: the TP summary lacks tp, its communication or rank 1's memory:\n"
                 f"{p.stderr}")
    print("ok  --tp 2:", head.strip(), "| tp comm line | peak memory of ranks 0 and 1")
    p = mpiexec(2, *TINY, "--steps", "1", "--grad-accum", "2", "--pp", "2", "--balance", "auto")
    line = next((l for l in p.stderr.splitlines() if l.startswith("--balance auto")), "")
    if ": stage 0 " not in line or ", stage 1 " not in line:
        sys.exit(f"FAIL: the balance line does not name its stages apart: {line!r}")
    print("ok ", line.strip()[:110])
