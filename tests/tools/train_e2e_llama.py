"""fsc-train --arch llama against a LLaMA written in plain torch ops
(tests/reference/torch_llama.py): 20 AdamW steps (fp32, constant lr, no
clipping, no dropout) from fsc's --save-init weights give PyTorch's per-step
losses within 1e-4 relative, in one process, under fsdp on 2 ranks, as a
2-stage pipeline and tensor-parallel over 2 ranks; what is not built is
refused by name."""
import os
import sys

from train_e2e_common import (TMP, expect_refused, import_torch, metrics, mpiexec, run,
                              torch_losses_of, varied_corpus_tokens)

LLAMA = ["--arch", "llama", "--layers", "2", "--d-model", "64", "--heads", "4", "--kv-heads", "2",
         "--seq", "32", "--vocab", "512", "--dropout", "0"]
STEPS, LR = 20, 1e-3
TRAIN = ["--steps", STEPS, "--lr", LR, "--schedule", "constant", "--clip", "0", "--quiet"]


def torch_losses(init, tokens, torch, torch_gpt, torch_llama, trainable=None):
    """The reference's per-step losses from init's weights; trainable(name) False
    freezes a tensor (requires_grad=False, as a frozen or LoRA base tensor)."""
    tensors, _ = torch_gpt.load_safetensors(init)
    model = torch_llama.Llama(tensors, layers_=2, heads=4, kv_heads=2)
    for n in model.names if trainable else ():
        model.p(n).requires_grad_(trainable(n))
    opt = torch_gpt.adamw(model, LR, (0.9, 0.95), 1e-8, 0.1)
    return torch_losses_of(torch_gpt, model, opt, tokens, STEPS)


def compare(what, fsc, ref):
    rel = max(abs(a - b) / abs(b) for a, b in zip(fsc, ref))
    print(f"{what}: {len(fsc)} AdamW steps, max relative loss difference from PyTorch {rel:.2e}")
    if len(fsc) != STEPS or rel > 1e-4:
        print("  fsc  ", " ".join(f"{v:.5f}" for v in fsc[::4]))
        print("  torch", " ".join(f"{v:.5f}" for v in ref[::4]))
        sys.exit(f"FAIL: {what}: per-step losses differ from PyTorch by {rel:.2e} (> 1e-4)")


def llama():
    torch, torch_gpt, torch_llama = import_torch("torch_gpt", "torch_llama")
    data, tokens = varied_corpus_tokens(torch, "llama.txt")
    init, m = os.path.join(TMP, "llama_init.safetensors"), os.path.join(TMP, "llama.jsonl")
    run(*LLAMA, "--data", data, "--batch", "4", *TRAIN, "--save-init", init, "--metrics", m)
    ref = torch_losses(init, tokens, torch, torch_gpt, torch_llama)
    compare("llama, one process", [r["loss"] for r in metrics(m)], ref)
    for name, extra in (("fsdp, 2 ranks", ["--strategy", "fsdp", "--batch", "2"]),
                        ("pipeline --pp 2", ["--strategy", "ddp", "--pp", "2", "--batch", "2",
                                             "--grad-accum", "2"]),
                        ("tensor parallel --tp 2", ["--strategy", "ddp", "--tp", "2",
                                                    "--batch", "4"])):
        m2 = os.path.join(TMP, "llama_%s.jsonl" % name.split()[0])
        mpiexec(2, *LLAMA, "--data", data, *extra, *TRAIN, "--metrics", m2)
        compare("llama, " + name, [r["loss"] for r in metrics(m2)], ref)
    # key/value heads are split over the TP group, never replicated
    mqa = LLAMA[:8] + ["--kv-heads", "1"] + LLAMA[10:]
    p = mpiexec(2, *mqa, "--data", data, "--strategy", "ddp", "--tp", "2", "--batch", "4", *TRAIN,
                expect_ok=False)
    expect_refused(p, "key/value heads 1", "--tp 2 with --kv-heads 1")
    p = run(*LLAMA, "--data", data, *TRAIN, "--pp", "1", "--qkv-bias", "2", expect_ok=False)
    expect_refused(p, "qkv-bias", "--qkv-bias 2")
    p = run("--layers", "2", "--d-model", "64", "--heads", "4", "--kv-heads", "2", "--data", data,
            *TRAIN, expect_ok=False)
    expect_refused(p, "--kv-heads is a LLaMA-family setting", "--kv-heads without --arch llama")
    print("ok  llama refusals name the flag")
