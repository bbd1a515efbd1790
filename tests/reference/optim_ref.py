#!/usr/bin/env python3
"""Goldens for tests/optim/test_optim.c: torch.optim SGD/Adam/AdamW and clip_grad_norm_.

Writes tests/data/optim_golden.json. Every case starts from the same initial
parameters and sees the same per-step gradients (drawn once, independent of
the parameters), so the C test replays them and compares the parameters after
each step. Floats are float32 values written as shortest-repr doubles, so the
C side reads them back exactly. Run with Debian's python3-torch (1.13):

    /usr/bin/python3 tests/reference/optim_ref.py
"""
import json
import math
import os

import torch

STEPS = 10
TENSORS = [  # name, shape, decay (AdamW-style: >= 2 dims)
    ("w1", [4, 3], True),
    ("b1", [4], False),
    ("w2", [2, 4], True),
    ("b2", [2], False),
]

# config as the C struct spells it; decay_all=False puts weight decay only on
# the decay tensors (torch: two param groups).
CASES = [
    {"name": "sgd_plain", "kind": "sgd", "lr": 0.1},
    {"name": "sgd_momentum_dampening", "kind": "sgd", "lr": 0.05, "momentum": 0.9,
     "dampening": 0.1},
    {"name": "sgd_nesterov_wd", "kind": "sgd", "lr": 0.05, "momentum": 0.8, "nesterov": True,
     "weight_decay": 0.01},
    {"name": "sgd_momentum_wd_all", "kind": "sgd", "lr": 0.02, "momentum": 0.5,
     "weight_decay": 0.1, "decay_all": True},
    {"name": "adam_default", "kind": "adam", "lr": 1e-3},
    {"name": "adam_l2", "kind": "adam", "lr": 1e-2, "beta1": 0.8, "beta2": 0.99, "eps": 1e-6,
     "weight_decay": 0.05, "decay_all": True},
    {"name": "adamw_decay_some", "kind": "adamw", "lr": 1e-2, "weight_decay": 0.1},
    # lr changes every step (a warm-up then decay, given explicitly)
    {"name": "adamw_lr_per_step", "kind": "adamw", "lr": 3e-2, "weight_decay": 0.2,
     "beta2": 0.95, "decay_all": True,
     "lrs": [0.01, 0.02, 0.03, 0.028, 0.024, 0.018, 0.012, 0.007, 0.004, 0.003]},
]


def flat(ts):
    return [[float(x) for x in t.detach().reshape(-1).tolist()] for t in ts]


def make_tensors(gen, scale):
    return [torch.randn(shape, generator=gen, dtype=torch.float32) * scale
            for _, shape, _ in TENSORS]


def run_case(case, init, grads):
    params = [t.clone().requires_grad_(True) for t in init]
    wd = case.get("weight_decay", 0.0)
    decay_all = case.get("decay_all", False)
    groups = []
    for p, (_, _, decay) in zip(params, TENSORS):
        groups.append({"params": [p], "weight_decay": wd if (decay or decay_all) else 0.0})
    lr = case["lr"]
    if case["kind"] == "sgd":
        opt = torch.optim.SGD(groups, lr=lr, momentum=case.get("momentum", 0.0),
                              dampening=case.get("dampening", 0.0),
                              nesterov=case.get("nesterov", False), foreach=False)
    else:
        cls = torch.optim.Adam if case["kind"] == "adam" else torch.optim.AdamW
        opt = cls(groups, lr=lr, betas=(case.get("beta1", 0.9), case.get("beta2", 0.999)),
                  eps=case.get("eps", 1e-8), foreach=False)
    out = []
    for s in range(STEPS):
        if "lrs" in case:
            for g in opt.param_groups:
                g["lr"] = case["lrs"][s]
        for p, g in zip(params, grads[s]):
            p.grad = g.clone()
        opt.step()
        out.append(flat(params))
    return out


def clip_case(grads, max_norm, norm_type):
    ps = [torch.zeros_like(g, requires_grad=True) for g in grads]
    for p, g in zip(ps, grads):
        p.grad = g.clone()
    total = torch.nn.utils.clip_grad_norm_(ps, max_norm, norm_type=norm_type)
    return {"max_norm": max_norm, "norm_type": "inf" if math.isinf(norm_type) else norm_type,
            "grads_in": flat(grads), "grads_out": flat([p.grad for p in ps]),
            "total_norm": float(total)}


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1234)
    init = make_tensors(gen, 0.5)
    init = [t + 0.5 * torch.sign(t) for t in init]  # keep parameters away from 0
    grads = [make_tensors(gen, 0.3) for _ in range(STEPS)]

    golden = {
        "tensors": [{"name": n, "shape": s, "decay": d} for n, s, d in TENSORS],
        "init": flat(init),
        "grads": [flat(g) for g in grads],
        "cases": [],
        "clip": [],
    }
    for case in CASES:
        c = dict(case)
        c["params"] = run_case(case, init, grads)
        golden["cases"].append(c)

    big = [g * 4.0 for g in grads[0]]
    golden["clip"].append(clip_case(big, 1.0, 2.0))     # clipped
    golden["clip"].append(clip_case(big, 100.0, 2.0))   # untouched
    golden["clip"].append(clip_case(big, 0.5, math.inf))
    golden["clip"].append(clip_case(big, 50.0, math.inf))

    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "data", "optim_golden.json")
    with open(path, "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {os.path.normpath(path)} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
