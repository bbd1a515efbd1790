"""fsc-train --attention flash against --attention naive: the same per-step
losses (within the 1e-5 relative bound the strategies mode holds layouts to)
for GPT-2 (dropout on) in one process, under ddp on 2 ranks and under --tp 2,
and for a grouped-query LLaMA; flash keeping less activation memory; a bad
kernel name refused by name. T = 160 is no multiple of the kernel's tiles."""
import os
import sys

from train_e2e_common import TMP, expect_refused, metrics, mpiexec, run

COMMON = ["--layers", "2", "--d-model", "64", "--heads", "4", "--seq", "160", "--steps", "4",
          "--quiet"]
LAYOUTS = (
    ("single", 1, ["--batch", "4", "--dropout", "0.1"]),
    ("ddp x2", 2, ["--batch", "2", "--dropout", "0.1", "--strategy", "ddp"]),
    ("ddp tp 2", 2, ["--batch", "4", "--dropout", "0.1", "--strategy", "ddp", "--tp", "2"]),
    ("llama kv 2", 1, ["--batch", "4", "--arch", "llama", "--kv-heads", "2"]),
)


def attention():
    for name, ranks, extra in LAYOUTS:
        rows = {}
        for kind in ("naive", "flash"):
            m = os.path.join(TMP, f"{name.replace(' ', '_')}_{kind}.jsonl")
            args = [*COMMON, *extra, "--attention", kind, "--metrics", m]
            run(*args) if ranks == 1 else mpiexec(ranks, *args)
            rows[kind] = metrics(m)
        naive, flash = rows["naive"], rows["flash"]
        assert len(naive) == len(flash) == 4, name
        for a, r in zip(flash, naive):
            if abs(a["loss"] - r["loss"]) > 1e-5 * abs(r["loss"]):
                sys.exit(f"FAIL: {name} step {a['step']}: flash loss {a['loss']} vs naive "
                         f"{r['loss']}")
        activ = {k: max(r["mem"]["activ"] for r in v) for k, v in rows.items()}
        if name == "single" and not activ["flash"] < activ["naive"]:
            sys.exit(f"FAIL: {name}: flash keeps {activ['flash']} activation bytes, naive "
                     f"{activ['naive']}: the probabilities were kept")
        print(f"{name:12s} flash = naive losses " + " ".join(f"{r['loss']:.6f}" for r in flash)
              + f"; activation bytes {activ['flash']} vs {activ['naive']}")
    p = run(*COMMON, "--batch", "2", "--attention", "fast", expect_ok=False)
    expect_refused(p, "attention kernel 'fast'", "--attention fast")
    print("ok  --attention fast is refused by name")
