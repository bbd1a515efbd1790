"""fsc-train --arch llama --moe-experts: Mixtral's layout against a Mixtral
written in plain torch ops (tests/reference/torch_mixtral.py). 20 AdamW steps
(fp32, constant lr, no clipping, dropless top-2 with the load-balancing term
on) from fsc's --save-init weights give PyTorch's per-step losses within
1e-4 relative, in one process and with the experts spread over 2 ranks
(ddp); the directory --save-init writes carries Mixtral's names and
config.json (model_type mixtral, num_local_experts, num_experts_per_tok),
and --init-from reads it back: the same model, the same tensors bit for bit;
fsc-sample draws the same ids from it with and without the KV cache.
What MoE does not compose with (--pp, --tp) is refused by name."""
import json
import os
import subprocess
import sys

from train_e2e_common import (FSC_TRAIN, TMP, expect_refused, import_torch, metrics, mpiexec,
                              run, torch_losses_of, varied_corpus_tokens)
from train_e2e_llama import LR, STEPS, TRAIN, compare

E = 4
MOE = ["--arch", "llama", "--layers", "2", "--d-model", "64", "--heads", "4", "--kv-heads", "2",
       "--seq", "32", "--vocab", "512", "--dropout", "0", "--ffn-hidden", "96",
       "--moe-experts", E, "--moe-every", "1", "--moe-capacity", E, "--moe-aux-coef", "0.02"]


def torch_losses(init, tokens, torch, torch_gpt, torch_mixtral):
    tensors, _ = torch_gpt.load_safetensors(init)
    model = torch_mixtral.Mixtral(tensors, E, 0.02, layers_=2, heads=4, kv_heads=2)
    opt = torch_gpt.adamw(model, LR, (0.9, 0.95), 1e-8, 0.1)
    return torch_losses_of(torch_gpt, model, opt, tokens, STEPS, objective=model.objective)


def mixtral_files(init, torch_gpt):
    """Mixtral's tensor names and config.json fields in a --save-init directory."""
    tensors, _ = torch_gpt.load_safetensors(os.path.join(init, "model.safetensors"))
    want = {f"model.layers.{i}.block_sparse_moe.gate.weight" for i in range(2)}
    want |= {f"model.layers.{i}.block_sparse_moe.experts.{j}.w{k}.weight"
             for i in range(2) for j in range(E) for k in (1, 2, 3)}
    missing = want - set(tensors)
    if missing or any(".mlp." in n for n in tensors):
        sys.exit(f"FAIL: --save-init {init}: missing {sorted(missing)[:4]}, or a dense mlp")
    shapes = {"gate": [E, 64], "w1": [96, 64], "w3": [96, 64], "w2": [64, 96]}
    for n, t in tensors.items():
        if ".block_sparse_moe." in n and list(t.shape) != shapes[n.split(".")[-2]]:
            sys.exit(f"FAIL: {n} has shape {list(t.shape)}")
    cfg = json.load(open(os.path.join(init, "config.json")))
    got = {k: cfg.get(k) for k in ("model_type", "architectures", "num_local_experts",
                                   "num_experts_per_tok", "intermediate_size",
                                   "router_aux_loss_coef")}
    if got != {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
               "num_local_experts": E, "num_experts_per_tok": 2, "intermediate_size": 96,
               "router_aux_loss_coef": 0.02}:
        sys.exit(f"FAIL: {init}/config.json: {got}")
    print(f"Mixtral's names ({len(want)} MoE tensors) and config.json in {init}")
    return tensors


def llama_moe():
    torch, torch_gpt, torch_mixtral = import_torch("torch_gpt", "torch_mixtral")
    data, tokens = varied_corpus_tokens(torch, "moe.txt")
    init, m = os.path.join(TMP, "moe_init"), os.path.join(TMP, "moe.jsonl")
    run(*MOE, "--data", data, "--batch", "4", *TRAIN, "--save-init", init, "--metrics", m)
    tensors = mixtral_files(init, torch_gpt)
    ref = torch_losses(os.path.join(init, "model.safetensors"), tokens, torch, torch_gpt,
                       torch_mixtral)
    compare("llama MoE (Mixtral), one process", [r["loss"] for r in metrics(m)], ref)
    m2 = os.path.join(TMP, "moe_ep.jsonl")
    mpiexec(2, *MOE, "--data", data, "--strategy", "ddp", "--batch", "2", *TRAIN, "--metrics", m2)
    compare("llama MoE, experts over 2 ranks (ddp)", [r["loss"] for r in metrics(m2)], ref)
    # the directory reads back: the model from config.json alone, every tensor as written
    back = os.path.join(TMP, "moe_back")
    run("--data", data, "--init-from", init, "--steps", "0", "--quiet", "--save", back)
    again, _ = torch_gpt.load_safetensors(os.path.join(back, "model.safetensors"))
    if set(again) != set(tensors) or any(not bool((again[n] == tensors[n]).all()) for n in again):
        sys.exit("FAIL: --init-from a Mixtral directory and --save did not give its tensors back")
    mixtral_files(back, torch_gpt)
    print("--init-from a Mixtral directory: the same model and tensors written back")
    # fsc-sample reads the experts from config.json: the KV cache = the full forward
    sample = os.path.join(os.path.dirname(FSC_TRAIN), "fsc-sample")
    got = []
    for extra in ([], ["--no-kv-cache"]):
        p = subprocess.run([sample, "--model", back, "--prompt-ids", "1,2,3,4,5",
                            "--max-new-tokens", "16", "--ids", "--seed", "5", "--quiet", *extra],
                           capture_output=True, text=True, timeout=300)
        if p.returncode:
            sys.exit(f"FAIL: fsc-sample --model {back} {' '.join(extra)}: {p.stderr}")
        got.append(p.stdout.split())
    if got[0] != got[1] or len(got[0]) != 16:
        sys.exit(f"FAIL: fsc-sample of a Mixtral: KV cache {got[0]} vs full forward {got[1]}")
    print("fsc-sample of a Mixtral directory: the same 16 ids with and without the KV cache")
    for flag, extra in (("pp", ["--pp", "2", "--batch", "2", "--grad-accum", "2"]),
                        ("tp", ["--tp", "2", "--batch", "4"])):
        p = mpiexec(2, *MOE, "--data", data, "--strategy", "ddp", *extra, *TRAIN,
                    expect_ok=False)
        expect_refused(p, f"--moe-experts does not run with --{flag}", f"MoE with --{flag} 2")
    print("ok  llama MoE refusals name the flag")
