#!/usr/bin/env python3
"""Goldens for tests/nn/test_moe.c: the MoE MLP of fsc/moe.h computed densely.

Every token's output is evaluated directly from its two experts (no
dispatch buffers, no all-to-all): the routing rules are written with
FairScale's top2gating tensors (one-hot masks, cumsum positions, the second
choices queued behind every first choice, capacity masks, combine weights
normalised over the kept choices), one routing group per sequence. The
objective is sum(y * dy) + aux_coef * mean over rows of l_aux, with
l_aux = E * mean_e(me_e * ce_e). Writes tests/data/moe_golden.json (float32
values as shortest-repr doubles). Run with Debian's python3-torch (1.13):

    /usr/bin/python3 tests/reference/moe_ref.py
"""
import json
import math
import os

import torch
import torch.nn.functional as F

CASES = [  # capacity 2 of 8 tokens per expert: first and second choices dropped
    {"name": "drops", "B": 2, "T": 8, "C": 8, "E": 4, "H": 16, "factor": 1.0, "aux": 0.1},
    # capacity 8 = T: nothing dropped
    {"name": "nodrops", "B": 3, "T": 8, "C": 8, "E": 4, "H": 16, "factor": 4.0, "aux": 0.05},
]


def expert(x, w):
    h = F.gelu(x @ w["c_fc.weight"] + w["c_fc.bias"], approximate="tanh")
    return h @ w["c_proj.weight"] + w["c_proj.bias"]


def moe(x, wg, experts, factor, aux_coef):
    B, T, C = x.shape
    E = wg.shape[0]
    cap = max(1, math.ceil(factor * T / E))
    y = torch.zeros(B, T, C)
    auxes, drop1, drop2 = [], 0, 0
    for b in range(B):
        xb = x[b]
        gates = F.softmax((xb @ wg.t()).float(), dim=1)
        e1 = torch.argmax(gates, dim=1)
        mask1 = F.one_hot(e1, E)
        e2 = torch.argmax(gates.masked_fill(mask1.bool(), float("-inf")), dim=1)
        mask2 = F.one_hot(e2, E)
        loc1 = torch.cumsum(mask1, 0) - 1
        loc2 = torch.cumsum(mask2, 0) - 1 + mask1.sum(0, keepdim=True)
        me = gates.mean(0)
        ce = mask1.float().mean(0)
        auxes.append(E * torch.mean(me * ce))
        keep1 = (loc1 * mask1).sum(1) < cap
        keep2 = (loc2 * mask2).sum(1) < cap
        drop1 += int((~keep1).sum())
        drop2 += int((~keep2).sum())
        w1 = gates.gather(1, e1[:, None])[:, 0] * keep1
        w2 = gates.gather(1, e2[:, None])[:, 0] * keep2
        den = torch.clamp(w1 + w2, min=torch.finfo(torch.float32).eps)
        rows = []
        for t in range(T):
            out = torch.zeros(C)
            if keep1[t]:
                out = out + w1[t] / den[t] * expert(xb[t], experts[int(e1[t])])
            if keep2[t]:
                out = out + w2[t] / den[t] * expert(xb[t], experts[int(e2[t])])
            rows.append(out)
        y[b] = torch.stack(rows)
    aux = torch.stack(auxes).mean()
    return y, aux, drop1, drop2


def flat(t):
    return [float(v) for v in t.detach().reshape(-1).tolist()]


def case(c, gen):
    B, T, C, E, H = c["B"], c["T"], c["C"], c["E"], c["H"]
    x = torch.randn(B, T, C, generator=gen).requires_grad_()
    wg = (0.5 * torch.randn(E, C, generator=gen)).requires_grad_()
    experts = []
    for _ in range(E):
        w = {"c_fc.weight": 0.3 * torch.randn(C, H, generator=gen),
             "c_fc.bias": 0.1 * torch.randn(H, generator=gen),
             "c_proj.weight": 0.3 * torch.randn(H, C, generator=gen),
             "c_proj.bias": 0.1 * torch.randn(C, generator=gen)}
        experts.append({k: v.requires_grad_() for k, v in w.items()})
    dy = torch.randn(B, T, C, generator=gen)
    y, aux, d1, d2 = moe(x, wg, experts, c["factor"], c["aux"])
    ((y * dy).sum() + c["aux"] * aux).backward()
    out = dict(c)
    out.update({"x": flat(x), "gate": flat(wg), "dy": flat(dy), "y": flat(y),
                "l_aux": float(aux), "dropped1": d1, "dropped2": d2,
                "dx": flat(x.grad), "dgate": flat(wg.grad), "experts": []})
    for w in experts:
        out["experts"].append({k: flat(v) for k, v in w.items()} |
                              {"d" + k: flat(v.grad) for k, v in w.items()})
    return out


def main():
    gen = torch.Generator().manual_seed(16)
    golden = {"cases": [case(c, gen) for c in CASES]}
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "data", "moe_golden.json")
    with open(path, "w") as f:
        json.dump(golden, f)
    for c in golden["cases"]:
        print(f"{c['name']}: l_aux {c['l_aux']:.6f}, dropped {c['dropped1']} first and "
              f"{c['dropped2']} second choices")


if __name__ == "__main__":
    main()
