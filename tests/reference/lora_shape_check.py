#!/usr/bin/env python3
"""fsc-train's LoRA against the plain-torch PEFT reference (torch_lora.py) at
any LLaMA shape: a one-off check, not a ctest (at llama medium 20 steps take
minutes in each). fsc-train writes --save-init weights (base and adapters)
and its per-step losses; the reference trains the same adapters from them
on the same batches; prints the worst relative loss difference.

    python3 tests/reference/lora_shape_check.py build/tools/fsc-train \\
        --layers 8 --d-model 512 --heads 8 --kv-heads 2 --seq 256 --vocab 8192 --batch 4

Every step is fp32, dropout 0, constant lr 1e-3, no clipping, AdamW
(0.9, 0.95, 1e-8, wd 0.1); LoRA r=8, alpha 16 on q_proj,v_proj unless
--rank/--alpha/--targets say otherwise. Exit status 1 when the difference
passes --tol (1e-4)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

import torch_gpt
import torch_lora


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("fsc_train")
    for k, v in (("layers", 2), ("d-model", 64), ("heads", 4), ("kv-heads", 2), ("seq", 32),
                 ("vocab", 512), ("batch", 4), ("steps", 20), ("rank", 8)):
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument("--targets", default="q_proj,v_proj")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="fsc-lora-check-")
    data = os.path.join(tmp, "data.txt")
    with open(data, "wb") as f:  # varied bytes, deterministic (train_e2e_finetune.py's)
        f.write(bytes((i * 7919 + (i // 13) * 31) % 251 for i in range(200000)))
    tokens = torch.tensor(list(open(data, "rb").read()), dtype=torch.int64)
    init, metrics = os.path.join(tmp, "init"), os.path.join(tmp, "m.jsonl")
    cmd = [a.fsc_train, "--arch", "llama", "--layers", a.layers, "--d-model", a.d_model,
           "--heads", a.heads, "--kv-heads", a.kv_heads, "--seq", a.seq, "--vocab", a.vocab,
           "--dropout", "0", "--batch", a.batch, "--data", data, "--steps", a.steps,
           "--lr", a.lr, "--schedule", "constant", "--clip", "0", "--quiet",
           "--lora-rank", a.rank, "--lora-alpha", a.alpha, "--lora-targets", a.targets,
           "--save-init", init, "--metrics", metrics]
    cmd = [str(c) for c in cmd]
    print(" ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True)
    fsc = [json.loads(line)["loss"] for line in open(metrics) if '"loss"' in line]
    weights = os.path.join(init, "model.safetensors") if os.path.isdir(init) else init
    tensors, _ = torch_gpt.load_safetensors(weights)
    model = torch_lora.LoraLlama(tensors, a.rank, a.alpha, layers_=a.layers, heads=a.heads,
                                 kv_heads=a.kv_heads)
    opt = model.adamw(a.lr, (0.9, 0.95), 1e-8, 0.1)
    ref = []
    for s in range(a.steps):
        x, y = torch_gpt.batch(tokens, s, 0, 0, a.batch, 1, 1, a.seq)
        opt.zero_grad()
        loss = model.loss(x, y)
        loss.backward()
        opt.step()
        ref.append(loss.item())
    rel = max(abs(p - q) / abs(q) for p, q in zip(fsc, ref))
    print("fsc  ", " ".join(f"{v:.6f}" for v in fsc))
    print("torch", " ".join(f"{v:.6f}" for v in ref))
    print(f"{len(fsc)} steps, worst relative loss difference {rel:.2e} (tolerance {a.tol:g})")
    return 0 if len(fsc) == a.steps and rel <= a.tol else 1


if __name__ == "__main__":
    sys.exit(main())
