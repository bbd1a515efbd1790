"""fsc-train end to end, training itself: it learns, micro-batches and every
strategy and layout give the same losses, the optimizer options act, and (when PyTorch
is present) its models and losses agree with PyTorch."""
import json
import os
import sys

from train_e2e_common import (TINY, TMP, corpus_tokens, expect_refused, expect_torch_losses,
                              import_torch, metrics, mpiexec, run, run_metrics, varied_corpus)


def learns():
    m = os.path.join(TMP, "m.jsonl")
    run("--layers", "2", "--d-model", "128", "--heads", "4", "--seq", "64", "--batch", "8",
        "--steps", "120", "--lr", "2e-3", "--warmup", "10", "--metrics", m, "--quiet")
    rows = metrics(m)
    first = rows[0]["loss"]
    last = sum(r["loss"] for r in rows[-10:]) / 10
    print(f"builtin corpus: loss {first:.3f} -> {last:.3f} (mean of the last 10 steps)")
    assert len(rows) == 120 and rows[-1]["step"] == 120
    assert all(k in rows[0] for k in ("step", "loss", "lr", "grad_norm", "tokens_per_s", "mem"))
    mem = rows[0]["mem"]
    assert set(mem) == {"params", "grads", "optim", "activ", "comm", "work", "gathered"}, mem
    assert mem["params"] > 0 and mem["optim"] > 0 and mem["activ"] > 0, mem
    if not last < first - 2.0:
        sys.exit(f"FAIL: loss did not fall enough: {first:.3f} -> {last:.3f}")


def accumulation():
    """batch 8 = batch 4 x 2 micro-steps = batch 2 x 4: same data, same dropout masks
    (keyed by global sample index), same mean loss, same gradient, same run."""
    runs = {}
    for b, k in ((8, 1), (4, 2), (2, 4)):
        m = os.path.join(TMP, f"acc{b}.jsonl")
        run("--layers", "2", "--d-model", "64", "--heads", "4", "--seq", "32", "--batch", b,
            "--grad-accum", k, "--steps", "8", "--dropout", "0.1", "--metrics", m, "--quiet")
        runs[(b, k)] = metrics(m)
    ref = runs[(8, 1)]
    worst = 0.0
    for key, rows in runs.items():
        for a, r in zip(rows, ref):
            for field in ("loss", "grad_norm"):
                worst = max(worst, abs(a[field] - r[field]) / abs(r[field]))
                # measured max rel 1.8e-7 (Haswell), 0 (SkylakeX): 110x headroom
                if abs(a[field] - r[field]) > 2e-5 * abs(r[field]):
                    sys.exit(f"FAIL: batch {key[0]} x accum {key[1]} step {a['step']}: {field} "
                             f"{a[field]} vs {r[field]} with batch 8")
    print("batch 8 = 4 x 2 = 2 x 4 micro-batches (dropout 0.1): losses "
          + " ".join(f"{r['loss']:.5f}" for r in ref) + f" (max rel {worst:.1e})")


def strategies():
    """single (batch 8) = dp 2 threads (batch 8) = ddp 2 ranks (batch 4 each) = ddp 4 ranks
    (batch 2 each, 2 micro-batches... here 1): same data order, same losses."""
    common = ["--layers", "2", "--d-model", "64", "--heads", "4", "--seq", "32", "--steps", "6",
              "--dropout", "0.1", "--quiet"]
    out = {}
    for name, ranks, extra in (
            ("single", 1, ["--batch", "8"]),
            ("dp x2", 1, ["--batch", "8", "--strategy", "dp", "--threads", "2"]),
            ("ddp x2", 2, ["--batch", "4", "--strategy", "ddp"]),
            ("ddp x4, accum 2, small buckets", 4,
             ["--batch", "1", "--grad-accum", "2", "--strategy", "ddp", "--bucket-mb", "0.05"]),
            ("oss x2 (greedy)", 2, ["--batch", "4", "--strategy", "oss", "--partition", "greedy"]),
            ("sdp x4, accum 2, small buckets", 4,
             ["--batch", "1", "--grad-accum", "2", "--strategy", "sdp", "--bucket-mb", "0.02"])):
        out[name] = metrics(run_metrics(f"strategies-{len(out)}.jsonl", *common, *extra,
                                        ranks=ranks))
    # pipelines: 4 layers (embedding, 2 blocks, head) over 2 ranks, and dp 2 x pp 2 with the
    # replicas' ZeRO stages
    for n, strat, sched, extra in (
            (2, "ddp", "1f1b", ["--batch", "2", "--grad-accum", "4"]),
            (2, "ddp", "gpipe", ["--batch", "4", "--grad-accum", "2", "--balance", "1,3"]),
            (2, "ddp", "interleaved", ["--batch", "2", "--grad-accum", "4"]),
            (4, "ddp", "1f1b", ["--batch", "2", "--grad-accum", "2"]),
            (4, "fsdp", "1f1b", ["--batch", "2", "--grad-accum", "2"]),
            (4, "oss", "gpipe", ["--batch", "1", "--grad-accum", "4"])):
        m = os.path.join(TMP, f"pp{n}{strat}{sched}.jsonl")
        trace = os.path.join(TMP, f"pp{n}{strat}{sched}.trace.json")
        mpiexec(n, *common, *extra, "--strategy", strat, "--pp", "2", "--pipe-schedule", sched,
                "--metrics", m, "--trace", trace)
        out[f"{strat} x{n // 2} pp 2 {sched} {' '.join(extra[2:])}"] = metrics(m)
        # the trace: every action of the last step, one row per pipeline rank
        with open(trace) as f:
            events = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
        micro, chunks = int(extra[extra.index("--grad-accum") + 1]), 2 if sched == "interleaved" else 1
        want = 2 * chunks * micro * 2 + 2 * (2 * chunks - 1) * micro * 2  # F, B; sends, receives
        if len(events) != want or {e["tid"] for e in events} != {0, 1}:
            sys.exit(f"FAIL: --trace {sched}: {len(events)} actions on ranks "
                     f"{sorted({e['tid'] for e in events})}, expected {want} on 0 and 1")
    # tensor parallelism: 2 ranks as one replica (ddp, oss), and dp 2 x tp 2 with sequence
    # parallelism under sdp, and under fsdp (the TP model one pipeline stage, sharded over dp)
    for n, strat, extra in ((2, "ddp", ["--batch", "8"]), (2, "oss", ["--batch", "8"]),
                            (4, "sdp", ["--batch", "4", "--sequence-parallel"]),
                            (4, "fsdp", ["--batch", "2", "--grad-accum", "2"])):
        m = os.path.join(TMP, f"tp{n}{strat}.jsonl")
        mpiexec(n, *common, *extra, "--strategy", strat, "--tp", "2", "--metrics", m)
        out[f"{strat} x{n // 2} tp 2 {' '.join(extra[2:])}"] = metrics(m)
    ref = out["single"]
    for name, rows in out.items():
        assert len(rows) == len(ref), name
        for a, r in zip(rows, ref):
            if abs(a["loss"] - r["loss"]) > 1e-5 * abs(r["loss"]):
                sys.exit(f"FAIL: {name} step {a['step']}: loss {a['loss']} vs single {r['loss']}")
        print(f"{name:32s} losses " + " ".join(f"{r['loss']:.5f}" for r in rows))
    # bad input under a launcher
    p = mpiexec(2, *common, "--strategy", "single", expect_ok=False)
    expect_refused(p, "use --strategy ddp", "--strategy single under 2 ranks")
    print("ok  --strategy single under mpiexec -n 2 is refused")
    p = mpiexec(4, *common, "--strategy", "sdp", "--pp", "2", "--bucket-mb", "1", expect_ok=False)
    expect_refused(p, "bucket_bytes does not apply under a pipeline", "--bucket-mb under --pp")
    print("ok  a row's own option under --pp is refused by name")
    p = mpiexec(2, *common, "--strategy", "fsdp", "--tp", "2", "--min-params", "100",
                expect_ok=False)
    expect_refused(p, "min_params does not apply with tensor parallelism",
                   "fsdp --tp 2 --min-params")
    print("ok  fsdp's own option under --tp is refused by name")


def optimizers():
    """--adascale: the gain stays in [1, S] (S = ranks x micro-batches), --steps counts
    scale-invariant steps (fewer real ones when the gain exceeds 1), and one process with one
    micro-batch (S = 1) trains exactly as without it; --strategy slowmo learns, and its flags
    are refused by name under another strategy."""
    common = ["--layers", "2", "--d-model", "64", "--heads", "4", "--seq", "32", "--quiet"]
    m = os.path.join(TMP, "ada.jsonl")
    mpiexec(2, *common, "--steps", "20", "--batch", "4", "--grad-accum", "2", "--strategy", "ddp",
            "--adascale", "--metrics", m)
    rows = metrics(m)
    gains = [r["gain"] for r in rows]
    print(f"adascale, 2 ranks x 2 micro-batches: {len(rows)} steps to progress "
          f"{rows[-1]['progress']:.2f}, gain {min(gains):.3f}..{max(gains):.3f}")
    if not all(1 <= g <= 4 for g in gains) or rows[-1]["progress"] < 20 or len(rows) >= 20:
        sys.exit("FAIL: AdaScale's gain, progress or step count is off")
    if any(abs(r["lr"] - r["gain"] * r["base_lr"]) > 1e-5 * r["lr"] for r in rows):  # 6 digits each
        sys.exit("FAIL: AdaScale's lr is not gain x base lr")
    a, b = os.path.join(TMP, "ada1.jsonl"), os.path.join(TMP, "plain1.jsonl")
    run(*common, "--steps", "5", "--batch", "4", "--adascale", "--metrics", a)
    run(*common, "--steps", "5", "--batch", "4", "--metrics", b)
    if [r["loss"] for r in metrics(a)] != [r["loss"] for r in metrics(b)]:
        sys.exit("FAIL: AdaScale at S = 1 changed the training")
    print("ok  adascale at S = 1 trains bit for bit as without it")
    m = os.path.join(TMP, "slowmo.jsonl")
    mpiexec(2, *common, "--steps", "24", "--batch", "4", "--strategy", "slowmo",
            "--localsgd-frequency", "4", "--slowmo-frequency", "8", "--slowmo-momentum", "0.5",
            "--metrics", m)
    losses = [r["loss"] for r in metrics(m)]
    print("slowmo (local SGD every 4, slow momentum 0.5 every 8): losses " +
          " ".join(f"{v:.3f}" for v in losses[::4]))
    if not losses[-1] < losses[0] - 0.5:
        sys.exit("FAIL: slowmo did not learn")
    p = mpiexec(2, *common, "--steps", "2", "--strategy", "ddp", "--slowmo-frequency", "8",
                expect_ok=False)
    expect_refused(p, "slowmo_frequency applies to slowmo only", "--slowmo-frequency under ddp")
    print("ok  slowmo's flags are refused by name under ddp")


def torch_cross_check():
    torch, torch_gpt = import_torch("torch_gpt")
    data = varied_corpus("data.txt")
    init, final, m = (os.path.join(TMP, n) for n in ("init.safetensors", "final.safetensors", "m.jsonl"))
    steps, lr, warmup = 20, 1e-3, 5
    run(*TINY, "--data", data, "--steps", steps, "--lr", lr, "--warmup", warmup, "--clip", "1.0",
        "--save-init", init, "--save", final, "--metrics", m, "--quiet")
    fsc_losses = [r["loss"] for r in metrics(m)]

    tensors, meta = torch_gpt.load_safetensors(init)
    cfg = json.loads(meta["fsc.gpt_config"])
    model = torch_gpt.GPT(cfg["vocab_size"], cfg["n_positions"], cfg["n_layer"], cfg["n_embd"],
                          cfg["n_head"])
    model.load(tensors)
    tokens = corpus_tokens(torch, data)
    opt = torch_gpt.adamw(model, lr, (0.9, 0.95), 1e-8, 0.1)
    torch_losses = []
    for s in range(steps):
        x, y = torch_gpt.batch(tokens, s, 0, 0, 4, 1, 1, 32)
        for g in opt.param_groups:
            g["lr"] = torch_gpt.lr_at(s, lr, warmup, steps, 0.1)
        opt.zero_grad()
        loss = model.loss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([model.p(k) for k in model.names], 1.0)
        opt.step()
        torch_losses.append(loss.item())
    rel = max(abs(a - b) / abs(b) for a, b in zip(fsc_losses, torch_losses))
    print(f"20 AdamW steps, same init and data: max relative loss difference {rel:.2e}")
    print("  fsc  ", " ".join(f"{v:.5f}" for v in fsc_losses[::4]))
    print("  torch", " ".join(f"{v:.5f}" for v in torch_losses[::4]))
    if rel > 1e-4:
        sys.exit(f"FAIL: per-step losses differ from PyTorch by {rel:.2e} (> 1e-4)")

    # The trained model opens in PyTorch and gives fsc's loss on fresh batches.
    trained, _ = torch_gpt.load_safetensors(final)
    model.load(trained)
    m2 = os.path.join(TMP, "m2.jsonl")
    run(*TINY, "--data", data, "--steps", "3", "--lr", "0", "--init-from", final, "--metrics", m2,
        "--quiet", "--schedule", "constant")
    fsc_eval = [r["loss"] for r in metrics(m2)]
    expect_torch_losses("fsc-trained model", model, tokens, fsc_eval)
