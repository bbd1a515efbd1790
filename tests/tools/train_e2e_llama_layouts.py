"""fsc-train --arch llama under every technique, against one process on the same global
batch (the GPT-2 family's checks in train_e2e_training.py, for the LLaMA family):

llama-strategies: dp threads, ddp, oss, sdp, fsdp (units per decoder layer),
activation checkpointing, every pipeline schedule and cuts inside a decoder layer give
one process's per-step losses within 1e-5 relative (the GPT-2 check's bound: summation
order only).

llama-techniques: tensor and sequence parallelism, pp x tp and the dp x pp x tp mesh
likewise; SlowMo averaging every step without slow momentum under SGD is DDP's step;
AdaScale on 2 ranks gives one process's gains and losses over the same 2 sub-batches;
bf16 autocast stays within the bound train_e2e_fsdp.py states for it.

llama-resume: a checkpoint saved under one layout resumes under another (--tp 2 -> one
process, fsdp 2 -> pp 2) and continues the uninterrupted run's losses within 1e-5."""
import os
import sys

from train_e2e_common import TMP, metrics, mpiexec, run, varied_corpus

MODEL = ["--arch", "llama", "--layers", "2", "--d-model", "64", "--heads", "4", "--kv-heads",
         "2", "--seq", "32", "--vocab", "512", "--dropout", "0"]
REL = 1e-5  # train_e2e_training.strategies' bound: the layouts differ in summation order only


def corpus():
    return varied_corpus("llama_layouts.txt")


def losses(n, name, *args, env=None):
    """Per-step losses of fsc-train on n ranks (n = 1: no launcher)."""
    m = os.path.join(TMP, f"llama-{name}.jsonl")
    if n == 1:
        run(*args, "--metrics", m)
    else:
        mpiexec(n, *args, "--metrics", m, env=env)
    return metrics(m)


def expect_same(name, rows, ref, rel=REL, key="loss"):
    if len(rows) != len(ref):
        sys.exit(f"FAIL: llama, {name}: {len(rows)} steps, one process {len(ref)}")
    worst = max(abs(a[key] - r[key]) / abs(r[key]) for a, r in zip(rows, ref))
    print(f"llama, {name:44s} max rel {key} difference from one process {worst:.1e}")
    if worst > rel:
        sys.exit(f"FAIL: llama, {name}: {key} differs from one process by {worst:.2e} "
                 f"(> {rel:g}): {[a[key] for a in rows]} vs {[r[key] for r in ref]}")


def llama_strategies():
    data = corpus()
    common = [*MODEL, "--data", data, "--steps", "6", "--lr", "2e-3", "--quiet"]
    ref = losses(1, "single", *common, "--batch", "8")
    runs = (
        (1, "dp 2 threads", ["--strategy", "dp", "--threads", "2", "--batch", "8"]),
        (2, "ddp 2", ["--strategy", "ddp", "--batch", "4"]),
        (2, "oss 2", ["--strategy", "oss", "--batch", "4"]),
        (2, "sdp 2, accum 2", ["--strategy", "sdp", "--batch", "2", "--grad-accum", "2"]),
        (2, "fsdp 2 (a unit per decoder layer)", ["--strategy", "fsdp", "--batch", "4"]),
        (2, "fsdp 2, checkpointed layers", ["--strategy", "fsdp", "--batch", "4",
                                            "--checkpoint-activations"]),
        (1, "one process, checkpointed layers", ["--batch", "8", "--checkpoint-activations"]),
        (2, "pp 2 1f1b", ["--strategy", "ddp", "--pp", "2", "--batch", "2", "--grad-accum", "4"]),
        (2, "pp 2 interleaved", ["--strategy", "ddp", "--pp", "2", "--pipe-schedule",
                                 "interleaved", "--batch", "2", "--grad-accum", "4"]),
        (2, "pp 2 zbh1, cut after a layer's attention", [
            "--strategy", "ddp", "--pp", "2", "--pipe-schedule", "zbh1", "--balance", "1.5,2.5",
            "--batch", "2", "--grad-accum", "4"]),
        (2, "pp 2 gpipe, cut before down_proj", [
            "--strategy", "ddp", "--pp", "2", "--pipe-schedule", "gpipe", "--balance",
            "2.75,1.25", "--batch", "2", "--grad-accum", "4"]),
    )
    for i, (n, name, extra) in enumerate(runs):
        expect_same(name, losses(n, f"run{i}", *common, *extra), ref)


def llama_techniques():
    data = corpus()
    common = [*MODEL, "--data", data, "--steps", "6", "--lr", "2e-3", "--quiet"]
    ref = losses(1, "single", *common, "--batch", "8")
    runs = (
        (2, "tp 2 + sequence parallel", ["--strategy", "ddp", "--tp", "2",
                                         "--sequence-parallel", "--batch", "8"]),
        (4, "pp 2 x tp 2, cut before down_proj", [
            "--strategy", "ddp", "--pp", "2", "--tp", "2", "--balance", "1.75,2.25", "--batch",
            "2", "--grad-accum", "4"]),
        (4, "dp 2 x tp 2 fsdp", ["--strategy", "fsdp", "--tp", "2", "--batch", "4"]),
        (8, "dp 2 x pp 2 x tp 2 sdp, SP", [
            "--strategy", "sdp", "--pp", "2", "--tp", "2", "--sequence-parallel", "--batch", "2",
            "--grad-accum", "2"]),
    )
    for i, (n, name, extra) in enumerate(runs):
        expect_same(name, losses(n, f"mesh{i}", *common, *extra), ref)

    # SlowMo averaging every step without slow momentum is DDP's step under SGD (unclipped:
    # clipping each rank's own gradient is not linear)
    sgd = ["--optimizer", "sgd", "--lr", "0.5", "--clip", "0"]
    ref_sgd = losses(1, "single-sgd", *common, *sgd, "--batch", "8")
    expect_same("slowmo 2, averaging every step, SGD", losses(
        2, "slowmo", *common, *sgd, "--strategy", "slowmo", "--batch", "4",
        "--localsgd-frequency", "1", "--slowmo-momentum", "0", "--slowmo-lr", "1"), ref_sgd)
    # AdaScale: 2 ranks x 1 micro-batch against one process x 2 micro-batches of the same
    # global batch: the same sub-batches, so the same gains and steps
    one = losses(1, "adascale-1", *common, "--batch", "4", "--grad-accum", "2", "--adascale")
    two = losses(2, "adascale-2", *common, "--batch", "4", "--strategy", "ddp", "--adascale")
    expect_same("adascale 2 ranks (gain)", two, one, key="gain")
    expect_same("adascale 2 ranks", two, one)
    # bf16 autocast: train_e2e_fsdp.py's stated bound for it, against fp32
    env = dict(os.environ, FSC_BF16_GEMM="on")
    for n, name, extra in ((1, "one process", ["--batch", "8"]),
                           (2, "tp 2", ["--strategy", "ddp", "--tp", "2", "--batch", "8"])):
        got = losses(n, "bf16-" + name.split()[0], *common, *extra, "--mixed-precision", "bf16",
                     env=env)
        want = losses(n, "fp32-" + name.split()[0], *common, *extra)
        expect_same(f"bf16 autocast, {name}, vs its fp32 run", got, want, rel=2e-2)


def llama_resume():
    """Saved at one layout, resumed at another (--resume keeps the saved flags unless given
    again: the new layout's are): the uninterrupted run's losses."""
    data = corpus()
    common = [*MODEL, "--data", data, "--lr", "2e-3", "--quiet"]
    ref = losses(1, "resume-ref", *common, "--steps", "6", "--batch", "4", "--grad-accum", "2")
    for name, first, second in (
            ("--tp 2 -> one process",
             (2, ["--strategy", "ddp", "--tp", "2", "--batch", "4", "--grad-accum", "2"]),
             (1, ["--strategy", "single", "--tp", "1", "--batch", "4", "--grad-accum", "2"])),
            ("fsdp 2 -> pp 2", (2, ["--strategy", "fsdp", "--batch", "2", "--grad-accum", "2"]),
             (2, ["--strategy", "ddp", "--pp", "2", "--batch", "2", "--grad-accum", "4"]))):
        tag = "".join(c for c in name if c.isalnum())
        ckpt = os.path.join(TMP, f"llama-ckpt-{tag}")
        n, extra = first
        head = losses(n, f"resume-a-{tag}", *common, *extra, "--steps", "3", "--save-every", "3",
                      "--checkpoint-dir", ckpt)
        n, extra = second
        tail = losses(n, f"resume-b-{tag}", *common, *extra, "--steps", "6", "--resume", ckpt)
        expect_same(f"resumed {name}", head + [r for r in tail if r["step"] > 3], ref)
