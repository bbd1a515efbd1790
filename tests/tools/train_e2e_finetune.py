"""fsc-train fine-tuning end to end: --freeze under every strategy.

A small LLaMA with its MLPs and token embeddings frozen takes 20 AdamW steps;
PyTorch (tests/reference/torch_llama.py, the frozen tensors with
requires_grad=False) gives the per-step losses, which one process and 2 ranks
under ddp, oss, sdp, fsdp and a 2-stage pipeline meet within 1e-4 relative;
every frozen tensor of every run's saved weights equals --save-init's bit for
bit. GPT-2 under --tp 2 meets one process with the same freeze. The
optimizer's measured state shrinks to the trainable share, and a glob that
matches nothing is refused by name."""
import os
import re
import sys

from train_e2e_common import (TMP, expect_refused, import_torch, metrics, mpiexec, run,
                              torch_losses_of, varied_corpus_tokens)

LLAMA = ["--arch", "llama", "--layers", "2", "--d-model", "64", "--heads", "4", "--kv-heads", "2",
         "--seq", "32", "--vocab", "512", "--dropout", "0"]
FREEZE = "model.layers.*.mlp.*,model.embed_tokens.*"
STEPS, LR = 20, 1e-3
TRAIN = ["--steps", STEPS, "--lr", LR, "--schedule", "constant", "--clip", "0", "--quiet"]
# The 2-rank layouts a fine-tuning run is checked under, each against one process.
LAYOUTS = {"ddp": ["--strategy", "ddp", "--batch", "2"],
           "oss": ["--strategy", "oss", "--batch", "2"],
           "sdp": ["--strategy", "sdp", "--batch", "2"],
           "fsdp": ["--strategy", "fsdp", "--batch", "2"],
           "pp2": ["--strategy", "ddp", "--pp", "2", "--batch", "2", "--grad-accum", "2"],
           "tp2": ["--strategy", "ddp", "--tp", "2", "--batch", "4"],
           "tp2 + sequence parallel": ["--strategy", "ddp", "--tp", "2", "--batch", "4",
                                       "--sequence-parallel"]}


def frozen(name, patterns):
    import fnmatch
    return any(fnmatch.fnmatchcase(name, p) for p in patterns.split(","))


def torch_losses(init, tokens, torch, torch_gpt, torch_llama):
    """train_e2e_llama's reference with the FREEZE tensors frozen."""
    import train_e2e_llama
    return train_e2e_llama.torch_losses(init, tokens, torch, torch_gpt, torch_llama,
                                        trainable=lambda n: not frozen(n, FREEZE))


def compare(what, fsc, ref):
    rel = max(abs(a - b) / abs(b) for a, b in zip(fsc, ref))
    print(f"{what}: {len(fsc)} steps, max relative loss difference {rel:.2e}")
    if len(fsc) != len(ref) or rel > 1e-4:
        sys.exit(f"FAIL: {what}: per-step losses differ by {rel:.2e} (> 1e-4)")


def frozen_unchanged(what, init, saved, torch_gpt, patterns):
    a, _ = torch_gpt.load_safetensors(weights_file(init))
    b, _ = torch_gpt.load_safetensors(weights_file(saved))
    names = [n for n in a if frozen(n, patterns)]
    moved = [n for n in names if not bool((a[n] == b[n]).all())]
    trained = [n for n in a if not frozen(n, patterns) and bool((a[n] == b[n]).all())]
    if not names or moved or trained:
        sys.exit(f"FAIL: {what}: frozen tensors changed {moved}, trainable ones did not {trained}")
    print(f"{what}: {len(names)} frozen tensors bit-identical after {STEPS} steps")


def optim_mib(stderr):
    m = re.search(r"measured optimizer state rank 0: ([0-9.]+) MiB", stderr)
    if not m:
        sys.exit("FAIL: fsc-train printed no measured optimizer state:\n" + stderr)
    return float(m.group(1))


def freeze():
    torch, torch_gpt, torch_llama = import_torch("torch_gpt", "torch_llama")
    data, tokens = varied_corpus_tokens(torch, "ft.txt")
    init, m = os.path.join(TMP, "ft_init.safetensors"), os.path.join(TMP, "ft.jsonl")
    saved = os.path.join(TMP, "ft_saved.safetensors")
    run(*LLAMA, "--data", data, "--batch", "4", *TRAIN, "--freeze", FREEZE, "--save-init", init,
        "--save", saved, "--metrics", m)
    ref = torch_losses(init, tokens, torch, torch_gpt, torch_llama)
    compare("--freeze, one process", [r["loss"] for r in metrics(m)], ref)
    frozen_unchanged("--freeze, one process", init, saved, torch_gpt, FREEZE)
    for name, extra in LAYOUTS.items():
        m2, s2 = os.path.join(TMP, f"ft_{name}.jsonl"), os.path.join(TMP, f"ft_{name}.st")
        mpiexec(2, *LLAMA, "--data", data, *extra, *TRAIN, "--freeze", FREEZE, "--metrics", m2,
                "--save", s2)
        compare(f"--freeze, {name} on 2 ranks", [r["loss"] for r in metrics(m2)], ref)
        frozen_unchanged(f"--freeze, {name} on 2 ranks", init, s2, torch_gpt, FREEZE)
    # fsdp shards frozen tensors apart (no gradient); its checkpoint is still by name
    ck, m3, m4 = (os.path.join(TMP, n) for n in ("ft_fsdp_ckpt", "ft_fsdp_a.jsonl", "ft_fsdp_b.jsonl"))
    mpiexec(2, *LLAMA, "--data", data, "--strategy", "fsdp", "--batch", "2", *TRAIN[2:],
            "--steps", "10", "--freeze", FREEZE, "--save-every", "10", "--checkpoint-dir", ck,
            "--metrics", m3)
    run(*LLAMA, "--data", data, "--batch", "4", *TRAIN, "--freeze", FREEZE, "--resume", ck,
        "--metrics", m4)
    compare("--freeze, fsdp checkpoint of 2 ranks at step 10 resumed in one process",
            [r["loss"] for r in metrics(m3)] + [r["loss"] for r in metrics(m4) if r["step"] > 10],
            ref)

    # GPT-2's names under tensor parallelism (llama is not split by --tp yet)
    gpt = ["--layers", "2", "--d-model", "64", "--heads", "4", "--seq", "32", "--vocab", "512",
           "--dropout", "0", "--data", data, "--batch", "4", *TRAIN, "--freeze", "h.*.mlp.*,wpe.*"]
    g1, g2 = os.path.join(TMP, "ft_g1.jsonl"), os.path.join(TMP, "ft_g2.jsonl")
    gi, gs = os.path.join(TMP, "ft_g_init.st"), os.path.join(TMP, "ft_g_tp.st")
    run(*gpt, "--metrics", g1, "--save-init", gi)
    mpiexec(2, *gpt, "--strategy", "ddp", "--tp", "2", "--metrics", g2, "--save", gs)
    compare("--freeze, GPT-2 --tp 2 against one process", [r["loss"] for r in metrics(g2)],
            [r["loss"] for r in metrics(g1)])
    frozen_unchanged("--freeze, GPT-2 --tp 2", gi, gs, torch_gpt, "h.*.mlp.*,wpe.*")

    # optimizer state: the trainable share of the full run's, measured by the allocator
    big = ["--layers", "2", "--d-model", "128", "--heads", "4", "--seq", "32", "--vocab", "8192",
           "--dropout", "0", "--data", data, "--batch", "2", "--steps", "1", "--lr", LR]
    full = optim_mib(run(*big).stderr)
    part = optim_mib(run(*big, "--freeze", "wte.*").stderr)
    share = 1 - 8192 * 128 / (8192 * 128 + 32 * 128 + 2 * (12 * 128 * 128 + 13 * 128) + 2 * 128)
    print(f"optimizer state: {full:.1f} MiB, with wte frozen {part:.1f} MiB "
          f"(trainable share {share:.3f})")
    if abs(part - full * share) > 0.1:  # the figures are printed to 0.1 MiB
        sys.exit(f"FAIL: optimizer state with wte frozen is {part} MiB, expected "
                 f"{full * share:.2f} MiB")
    p = run(*LLAMA, "--data", data, "--batch", "4", *TRAIN, "--freeze", "model.layers.*,nope.*",
            expect_ok=False)
    expect_refused(p, "pattern 'nope.*' matches no parameter name", "--freeze with a stray glob")


LORA = ["--lora-rank", "4", "--lora-alpha", "8",
        "--lora-targets", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"]


def lora_losses(init, tokens, torch, torch_gpt, torch_lora):
    tensors, _ = torch_gpt.load_safetensors(init)
    model = torch_lora.LoraLlama(tensors, 4, 8.0, layers_=2, heads=4, kv_heads=2)
    opt = model.adamw(LR, (0.9, 0.95), 1e-8, 0.1)
    return torch_losses_of(torch_gpt, model, opt, tokens, STEPS)


def weights_file(path):
    """--save-init / --save of --arch llama write a directory; its weights file."""
    return os.path.join(path, "model.safetensors") if os.path.isdir(path) else path


def peft(data, torch_gpt):
    """--save-adapter writes PEFT's directory; --lora-merge writes W + (alpha/r) B A."""
    import json
    flags = [*LLAMA, "--data", data, "--batch", "4", "--steps", "5", "--lr", "1e-2", "--quiet",
             "--lora-rank", "4", "--lora-alpha", "8"]
    init, ad, merged = (os.path.join(TMP, n) for n in ("peft_init", "peft_ad", "peft_merged"))
    run(*flags, "--save-init", init, "--save-adapter", ad)
    run(*flags, "--save", merged, "--lora-merge")
    cfg = json.load(open(os.path.join(ad, "adapter_config.json")))
    want = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8,
            "lora_dropout": 0, "bias": "none", "target_modules": ["q_proj", "v_proj"]}
    if any(cfg.get(k) != v for k, v in want.items()) or "base_model_name_or_path" not in cfg:
        sys.exit(f"FAIL: adapter_config.json {cfg}")
    a, _ = torch_gpt.load_safetensors(os.path.join(ad, "adapter_model.safetensors"))
    names = {f"base_model.model.model.layers.{i}.self_attn.{p}_proj.lora_{x}.weight"
             for i in range(2) for p in "qv" for x in "AB"}
    if set(a) != names:
        sys.exit(f"FAIL: adapter_model.safetensors holds {sorted(a)}, expected {sorted(names)}")
    w0, _ = torch_gpt.load_safetensors(weights_file(init))
    m, _ = torch_gpt.load_safetensors(weights_file(merged))
    if any(".lora_" in n for n in m) or set(m) != {n for n in w0 if ".lora_" not in n}:
        sys.exit(f"FAIL: --lora-merge wrote {sorted(m)}")
    worst = 0.0
    for n in m:
        ref = w0[n].double()
        stem = "base_model.model." + n[: -len(".weight")]
        if stem + ".lora_A.weight" in a:
            ref = ref + 2.0 * (a[stem + ".lora_B.weight"].double() @ a[stem + ".lora_A.weight"].double())
        worst = max(worst, ((m[n].double() - ref).abs() / (1 + ref.abs())).max().item())
    if worst > 1e-6:
        sys.exit(f"FAIL: --lora-merge differs from W + (alpha/r) B A by {worst:.2e}")
    print(f"LoRA: PEFT adapter directory ({len(a)} tensors), merged weights within {worst:.1e}")


def lora_from(data, torch_gpt):
    """--init-from a base without adapters, --lora-from a PEFT directory, refusals by name."""
    import json
    import shutil
    import struct
    g = ["--layers", "2", "--d-model", "64", "--heads", "4", "--seq", "32", "--vocab", "512",
         "--dropout", "0", "--data", data, "--batch", "4", "--lr", "1e-2", "--quiet"]
    lo = ["--lora-rank", "4", "--lora-targets", "c_attn,c_fc"]
    base, ad, ad2, s0 = (os.path.join(TMP, n) for n in ("lf_base.st", "lf_ad", "lf_ad2", "lf_s0.st"))
    run(*g, "--steps", "3", "--save", base)
    run(*g, *lo, "--steps", "3", "--init-from", base, "--save-adapter", ad)
    run(*g, *lo, "--steps", "0", "--init-from", base, "--lora-from", ad, "--save-adapter", ad2,
        "--save", s0)
    same = open(os.path.join(ad, "adapter_model.safetensors"), "rb").read() == \
        open(os.path.join(ad2, "adapter_model.safetensors"), "rb").read()
    b, _ = torch_gpt.load_safetensors(base)
    m, _ = torch_gpt.load_safetensors(s0)
    if not same or any(not bool((b[n] == m[n]).all()) for n in b):
        sys.exit("FAIL: --init-from BASE --lora-from DIR did not load the base and the adapters")
    p = run(*g, "--lora-rank", "8", "--lora-targets", "c_attn,c_fc", "--steps", "1",
            "--init-from", base, "--lora-from", ad, expect_ok=False)
    expect_refused(p, "r is 4, --lora-rank is 8", "--lora-from with another rank")
    p = run(*g, "--lora-rank", "4", "--lora-targets", "c_attn", "--steps", "1",
            "--init-from", base, "--lora-from", ad, expect_ok=False)
    expect_refused(p, "target_modules", "--lora-from with other targets")
    bad = os.path.join(TMP, "lf_bad")
    os.makedirs(bad, exist_ok=True)
    shutil.copy(os.path.join(ad, "adapter_config.json"), bad)
    t, _ = torch_gpt.load_safetensors(os.path.join(ad, "adapter_model.safetensors"))
    names = sorted(t)[1:]  # one tensor missing
    hdr, blobs, off = {}, b"", 0
    for n in names:
        raw = t[n].float().numpy().tobytes()
        hdr[n] = {"dtype": "F32", "shape": list(t[n].shape), "data_offsets": [off, off + len(raw)]}
        off, blobs = off + len(raw), blobs + raw
    h = json.dumps(hdr).encode()
    with open(os.path.join(bad, "adapter_model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + blobs)
    p = run(*g, *lo, "--steps", "1", "--init-from", base, "--lora-from", bad, expect_ok=False)
    expect_refused(p, "no tensor " + sorted(t)[0], "--lora-from with a tensor missing")
    print("LoRA: --init-from a base and --lora-from an adapter directory; bad directories refused")


def tp_adapters(data, init, ref, torch_gpt):
    """--tp 2's adapters are layout-free: a checkpoint of --tp 2 resumes in one process on the
    reference's losses, and its PEFT directory holds one process's names in full shapes and
    loads into one process unchanged."""
    lora = [*LLAMA, "--data", data, *TRAIN[2:], *LORA]  # TRAIN less its --steps
    tp = ["--strategy", "ddp", "--tp", "2", "--batch", "4"]
    ckpt, m1, m2 = (os.path.join(TMP, n) for n in ("lora_tp_ckpt", "lora_tp_a.jsonl",
                                                    "lora_tp_b.jsonl"))
    mpiexec(2, *lora, *tp, "--steps", "10", "--save-every", "10", "--checkpoint-dir", ckpt,
            "--metrics", m1)
    run(*lora, "--strategy", "single", "--tp", "1", "--batch", "4", "--steps", STEPS,
        "--resume", ckpt, "--metrics", m2)
    got = [r["loss"] for r in metrics(m1)] + [r["loss"] for r in metrics(m2) if r["step"] > 10]
    compare("LoRA, --tp 2 checkpoint at step 10 resumed in one process", got, ref)
    ad_tp, ad_one, ad_back = (os.path.join(TMP, n) for n in ("lora_ad_tp", "lora_ad_one",
                                                             "lora_ad_back"))
    mpiexec(2, *lora, *tp, "--steps", STEPS, "--save-adapter", ad_tp)
    run(*lora, "--batch", "4", "--steps", STEPS, "--save-adapter", ad_one)
    a, _ = torch_gpt.load_safetensors(os.path.join(ad_tp, "adapter_model.safetensors"))
    b, _ = torch_gpt.load_safetensors(os.path.join(ad_one, "adapter_model.safetensors"))
    if set(a) != set(b) or any(a[n].shape != b[n].shape for n in a):
        sys.exit(f"FAIL: --tp 2's adapter holds {sorted(a)}, one process's {sorted(b)}")
    # the values: the losses above here, the parameters against the noise floor in mpi_tp_lora
    print(f"LoRA: --tp 2's PEFT adapter holds one process's {len(a)} tensors in full shapes")
    run(*LLAMA, "--data", data, "--batch", "4", *LORA, "--steps", "0", "--quiet",
        "--init-from", init, "--lora-from", ad_tp, "--save-adapter", ad_back)
    same = open(os.path.join(ad_tp, "adapter_model.safetensors"), "rb").read() == \
        open(os.path.join(ad_back, "adapter_model.safetensors"), "rb").read()
    if not same:
        sys.exit("FAIL: one process --lora-from --tp 2's adapter did not load it unchanged")
    print("LoRA: --tp 2's adapter loads into one process (--init-from + --lora-from) bit for bit")


def lora():
    torch, torch_gpt, torch_lora = import_torch("torch_gpt", "torch_lora")
    data, tokens = varied_corpus_tokens(torch, "lora.txt")
    init, m = os.path.join(TMP, "lora_init"), os.path.join(TMP, "lora.jsonl")
    saved = os.path.join(TMP, "lora_saved")
    run(*LLAMA, "--data", data, "--batch", "4", *TRAIN, *LORA, "--save-init", init,
        "--save", saved, "--metrics", m)
    ref = lora_losses(weights_file(init), tokens, torch, torch_gpt, torch_lora)
    compare("LoRA r=4 on every Linear of a LLaMA, one process", [r["loss"] for r in metrics(m)],
            ref)
    a, _ = torch_gpt.load_safetensors(weights_file(init))
    b, _ = torch_gpt.load_safetensors(weights_file(saved))
    moved = [n for n in a if ".lora_" not in n and not bool((a[n] == b[n]).all())]
    trained = [n for n in a if ".lora_B." in n and bool((a[n] == b[n]).all())]
    if moved or trained or not any(".lora_A." in n for n in a):
        sys.exit(f"FAIL: LoRA: base tensors changed {moved}, adapters did not train {trained}")
    print(f"LoRA: {sum('.lora_' not in n for n in a)} base tensors bit-identical, "
          f"{sum('.lora_' in n for n in a)} adapter tensors trained")
    for name, extra in ((n, LAYOUTS[n]) for n in ("ddp", "fsdp", "pp2", "tp2",
                                                  "tp2 + sequence parallel")):
        m2 = os.path.join(TMP, f"lora_{name}.jsonl")
        mpiexec(2, *LLAMA, "--data", data, *extra, *TRAIN, *LORA, "--metrics", m2)
        compare(f"LoRA, {name} on 2 ranks", [r["loss"] for r in metrics(m2)], ref)
    gpt = ["--layers", "2", "--d-model", "64", "--heads", "4", "--seq", "32", "--vocab", "512",
           "--dropout", "0", "--data", data, *TRAIN, "--lora-rank", "4",
           "--lora-targets", "c_attn,c_proj,c_fc"]
    g1, g2 = os.path.join(TMP, "lora_g1.jsonl"), os.path.join(TMP, "lora_g2.jsonl")
    run(*gpt, "--batch", "4", "--metrics", g1)
    mpiexec(2, *gpt, "--strategy", "fsdp", "--batch", "2", "--metrics", g2)
    compare("LoRA on GPT-2's c_attn, c_proj, c_fc: fsdp on 2 ranks against one process",
            [r["loss"] for r in metrics(g2)], [r["loss"] for r in metrics(g1)])
    g3 = os.path.join(TMP, "lora_g3.jsonl")
    mpiexec(2, *gpt, "--strategy", "ddp", "--tp", "2", "--batch", "4", "--metrics", g3)
    compare("LoRA on GPT-2's c_attn (q, k, v blocks), c_proj, c_fc: --tp 2 against one process",
            [r["loss"] for r in metrics(g3)], [r["loss"] for r in metrics(g1)])
    tp_adapters(data, init, ref, torch_gpt)
    peft(data, torch_gpt)
    lora_from(data, torch_gpt)
    p = mpiexec(2, *LLAMA, "--data", data, "--strategy", "ddp", "--tp", "2", "--batch", "4",
                *TRAIN, "--lora-rank", "4", "--lora-targets", "q_proj,lm_head", expect_ok=False)
    expect_refused(p, "lm_head is a VocabParallelEmbedding", "LoRA on the lm_head under --tp")
    p = run(*LLAMA, "--data", data, "--batch", "4", *TRAIN, "--lora-rank", "4",
            "--lora-targets", "q_proj,qproj", expect_ok=False)
    expect_refused(p, "target module 'qproj' names no Linear", "a LoRA target naming nothing")


GROUPS = "model.layers.*.mlp.*:lr=3e-3,wd=0;model.embed_tokens.*:lr=5e-4,wd=0.05"


def group_losses(init, tokens, torch, torch_gpt, torch_llama, kind):
    """torch's param_groups: the two globs (first match wins), then fsc's default rule."""
    import fnmatch
    tensors, _ = torch_gpt.load_safetensors(init)
    model = torch_llama.Llama(tensors, layers_=2, heads=4, kv_heads=2)
    lr, wd = (1e-3, 0.1) if kind == "adamw" else (0.05, 0.01)
    spec = [("model.layers.*.mlp.*", 3e-3, 0.0), ("model.embed_tokens.*", 5e-4, 0.05)]
    groups = [{"params": [], "lr": g_lr, "weight_decay": g_wd} for _, g_lr, g_wd in spec]
    groups += [{"params": [], "lr": lr, "weight_decay": wd}, {"params": [], "lr": lr,
                                                               "weight_decay": 0.0}]
    for n in model.names:
        hit = [i for i, (p, _, _) in enumerate(spec) if fnmatch.fnmatchcase(n, p)]
        i = hit[0] if hit else (2 if model.p(n).dim() >= 2 else 3)
        groups[i]["params"].append(model.p(n))
    if kind == "adamw":
        opt = torch.optim.AdamW(groups, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    else:
        opt = torch.optim.SGD(groups, momentum=0.9, foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
    return torch_losses_of(torch_gpt, model, opt, tokens, STEPS, after_step=sched.step)


def param_groups():
    torch, torch_gpt, torch_llama = import_torch("torch_gpt", "torch_llama")
    data, tokens = varied_corpus_tokens(torch, "pg.txt")
    sched = ["--steps", STEPS, "--schedule", "warmup-constant", "--warmup", "5", "--clip", "0",
             "--quiet", "--param-group", GROUPS]
    for kind, flags in (("adamw", ["--lr", "1e-3", "--weight-decay", "0.1"]),
                        ("sgd", ["--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.05",
                                 "--weight-decay", "0.01"])):
        init, m = os.path.join(TMP, f"pg_{kind}_init"), os.path.join(TMP, f"pg_{kind}.jsonl")
        run(*LLAMA, "--data", data, "--batch", "4", *sched, *flags, "--save-init", init,
            "--metrics", m)
        ref = group_losses(weights_file(init), tokens, torch, torch_gpt, torch_llama, kind)
        compare(f"--param-group, {kind}, one process", [r["loss"] for r in metrics(m)], ref)
        m2 = os.path.join(TMP, f"pg_{kind}_fsdp.jsonl")
        mpiexec(2, *LLAMA, "--data", data, "--batch", "2", "--strategy", "fsdp", *sched, *flags,
                "--metrics", m2)
        compare(f"--param-group, {kind}, fsdp on 2 ranks", [r["loss"] for r in metrics(m2)], ref)
    p = run(*LLAMA, "--data", data, "--batch", "4", *sched, "--param-group", "nope.*:lr=1",
            expect_ok=False)
    expect_refused(p, "pattern 'nope.*' matches no parameter", "a param group matching nothing")
    p = run(*LLAMA, "--data", data, "--batch", "4", *sched, "--param-group", "model.*:lr=x",
            expect_ok=False)
    expect_refused(p, "'lr=x' is not lr=X or wd=Y", "a malformed param group")
    # the groups travel in the checkpoint: a resume continues them exactly; other groups are refused
    gpt = ["--layers", "2", "--d-model", "64", "--heads", "4", "--seq", "32", "--vocab", "512",
           "--dropout", "0", "--data", data, "--batch", "4", "--lr", "1e-3", "--quiet",
           "--param-group", "h.*.mlp.*:lr=3e-3,wd=0"]
    full, ck, res = (os.path.join(TMP, n) for n in ("pg_full.jsonl", "pg_ck", "pg_res.jsonl"))
    run(*gpt, "--steps", "4", "--metrics", full)
    run(*gpt, "--steps", "2", "--checkpoint-dir", ck, "--save-every", "2")
    run("--resume", ck, "--steps", "4", "--quiet", "--metrics", res)
    if [r["loss"] for r in metrics(res)] != [r["loss"] for r in metrics(full)][2:]:
        sys.exit("FAIL: --param-group: a resumed run differs from the uninterrupted one")
    p = run("--resume", ck, "--steps", "4", "--quiet", "--param-group", "h.*:lr=1e-2",
            expect_ok=False)
    expect_refused(p, "--param-group 'h.*.mlp.*:lr=3e-3,wd=0' -> 'h.*:lr=1e-2'",
                   "a resume with other param groups")
    print("--param-group: resumed from a checkpoint exactly; other groups on --resume refused")
