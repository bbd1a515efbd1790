#!/usr/bin/env python3
"""scripts/peer_bench.py, the PyTorch side of docs/benchmarks.md, kept working:
it trains the tiny config for 2 timed steps in one process and over 2 gloo
ranks, and must print one JSON line with a positive tokens/s, a finite loss
and fsc's parameter count for that shape; a FairScale row either runs or is
skipped with exit 77 and a reason. --arch llama trains in one process with
fsc's LLaMA parameter count, and its model (scripts/peer_llama.py) gives the
logits of the goldens' reference LLaMA (tests/reference/torch_llama.py) on
the same weights. Without torch the test is skipped (77).

usage: peer_bench_test.py REPO_ROOT
"""
import json
import math
import os
import subprocess
import sys

root = sys.argv[1]
script = os.path.join(root, "scripts", "peer_bench.py")
common = ["--config", "tiny", "--steps", "2", "--warmup", "1"]


def fsc_params(L, C, T, V):
    """fsc_gpt_num_params: embeddings, L blocks (two LayerNorms, qkv, proj,
    c_fc, c_proj with biases), ln_f; the head is wte."""
    block = 2 * 2 * C + (3 * C * C + 3 * C) + (C * C + C) + (4 * C * C + 4 * C) + (4 * C * C + C)
    return V * C + T * C + L * block + 2 * C


def fsc_llama_params(L, C, NH, NKV, F, V):
    """fsc_gpt_num_params for the LLaMA family: embed_tokens and an untied
    lm_head, L layers (two RMSNorms, q and o of C x C, k and v of C x NKV
    head dims, SwiGLU's three C x F), the final norm; no biases."""
    kv = NKV * (C // NH)
    return 2 * V * C + L * (2 * C + 2 * C * C + 2 * C * kv + 3 * C * F) + C


def llama_matches_reference():
    """The peer's LLaMA and the goldens' reference on one set of weights
    (drawn wide, so that every part moves the logits): equal up to fp32
    rounding, at most 1e-5 of the largest logit."""
    import types
    import torch
    sys.path[:0] = [os.path.join(root, "scripts"), os.path.join(root, "tests", "reference")]
    import peer_llama
    import torch_llama
    a = types.SimpleNamespace(layers=2, d_model=32, heads=4, kv_heads=2, ffn_hidden=48, seq=16, vocab=64)
    torch.manual_seed(0)
    model = peer_llama.Llama(a)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    ref = torch_llama.Llama(model.hf_state_dict(), a.layers, a.heads, a.kv_heads)
    x = torch.randint(0, a.vocab, (2, a.seq))
    with torch.no_grad():
        mine, want = model.logits(x), ref.logits(x)
    diff, scale = (mine - want).abs().max().item(), want.abs().max().item()
    return diff <= 1e-5 * scale, f"max |peer - reference| {diff:.3g} over logits up to {scale:.3g}"


def peer(*args):
    p = subprocess.run([sys.executable, script, *common, *args], capture_output=True, text=True,
                       timeout=240)
    return p.returncode, p.stdout, p.stderr


failures = []
rc, out, err = peer("--strategy", "single")
if rc == 77:
    print(f"SKIP: {err.strip()}")
    sys.exit(77)
assert fsc_params(4, 256, 128, 512) == 3323392  # fsc-bench's small, as docs/benchmarks.md states
for args in (("--strategy", "single"), ("--strategy", "ddp", "--ranks", "2")):
    if args != ("--strategy", "single"):
        rc, out, err = peer(*args)
    lines = out.strip().splitlines()
    if rc != 0 or len(lines) != 1:
        failures.append(f"{' '.join(args)}: exit {rc}, {len(lines)} lines; stderr: {err[-2000:]}")
        continue
    r = json.loads(lines[0])
    want = fsc_params(r["layers"], r["d_model"], r["seq"], r["vocab"])
    checks = [(r["tokens_per_s"] > 0, f"tokens_per_s {r['tokens_per_s']}"),
              (math.isfinite(r["last_loss"]), f"last_loss {r['last_loss']}"),
              (r["params"] == want, f"params {r['params']}, fsc's {want}"),
              (r["steps"] == 2, f"steps {r['steps']}"),
              (r["ranks"] == (2 if "ddp" in args else 1), f"ranks {r['ranks']}")]
    for ok, what in checks:
        if not ok:
            failures.append(f"{' '.join(args)}: {what}")
    print(f"ok: {' '.join(args)}: {r['tokens_per_s']} tokens/s, loss {r['first_loss']} -> {r['last_loss']}")
rc, out, err = peer("--arch", "llama")
lines = out.strip().splitlines()
if rc != 0 or len(lines) != 1:
    failures.append(f"--arch llama: exit {rc}, {len(lines)} lines; stderr: {err[-2000:]}")
else:
    r = json.loads(lines[0])
    want = fsc_llama_params(r["layers"], r["d_model"], r["heads"], r["kv_heads"], r["ffn_hidden"], r["vocab"])
    for ok, what in [(r["arch"] == "llama", f"arch {r['arch']}"),
                     (r["kv_heads"] == 1 and r["ffn_hidden"] == 256,
                      f"kv_heads {r['kv_heads']}, ffn_hidden {r['ffn_hidden']} (tiny: 1, 256)"),
                     (r["tokens_per_s"] > 0, f"tokens_per_s {r['tokens_per_s']}"),
                     (math.isfinite(r["last_loss"]), f"last_loss {r['last_loss']}"),
                     (r["params"] == want, f"params {r['params']}, fsc's {want}")]:
        if not ok:
            failures.append(f"--arch llama: {what}")
    print(f"ok: --arch llama: {r['tokens_per_s']} tokens/s, loss {r['first_loss']} -> {r['last_loss']}")
assert fsc_llama_params(8, 512, 8, 2, 1536, 8192) == 32514560  # fsc-bench --arch llama's medium
ok, what = llama_matches_reference()
print(f"{'ok' if ok else 'FAIL'}: the peer's LLaMA against tests/reference/torch_llama.py: {what}")
if not ok:
    failures.append(f"--arch llama's model: {what}")
rc, out, err = peer("--strategy", "fairscale-oss", "--ranks", "2")
if rc == 77 and "FairScale" in err:
    print("ok: fairscale-oss skipped cleanly (no FairScale here)")
elif rc != 0 or '"tokens_per_s"' not in out:
    failures.append(f"fairscale-oss: exit {rc}; stderr: {err[-2000:]}")
else:
    print("ok: fairscale-oss ran")
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
