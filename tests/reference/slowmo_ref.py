#!/usr/bin/env python3
"""Cross-check of fsc's slowmo row (src/train/strategy_slowmo.c) against
FairScale's SlowMoDistributedDataParallel with Local SGD as the base
algorithm, re-derived here in PyTorch from FairScale's source and
documentation (FairScale itself is not a dependency).

fsc trains the tiny GPT of tests/support/equivalence.h through the trainer on each
rank (`mpiexec -n W mpi_slowmo --dump ...`) and writes, per rank and step,
the gradient the local optimizer stepped on and the parameters after the
step. This script replays the same gradients the way FairScale's
perform_slowmo() treats them, after each rank's torch.optim step:

    t = number of steps so far (FairScale: num_updates + 1)
    t % slowmo_frequency == 0 (and slowmo_lr != 1 or momentum != 0):
        the memory-efficient step: the parameters are split into portions of
        L = ceil(P / W) elements; portion o is averaged onto rank o, which
        updates its share of the outer state with the learning rate of the
        step just taken (group["lr"]):
            buf = momentum * buf - avg / lr + old / lr
            old = old - slowmo_lr * lr * buf
            x   = old                       (then broadcast from rank o)
        (FairScale skips the Local SGD all-reduce on these steps: the
        reduce already averages)
    elif t % localsgd_frequency == 0: every rank takes the average.

`old` starts as the parameters before the first step, as FairScale's own
tests set it up (_init_global_momentum_buffers before training; left to
itself FairScale would copy them after the first local step).

The replay runs twice: in float64 (what the gradients give exactly) and in
float32 in FairScale's operation order. How far the float32 replay drifts
from the float64 one is the rounding noise of this computation; fsc, which
rounds in another order, must stay within 8 times that noise (the largest of
each window of 32 elements, so an element where two float32 orders agree by
chance is not held to zero) plus 16 float32 ulps of the value, at every step
and on every rank. The comparison must fail for deliberately wrong replays
(outer step of the wrong sign, lr or slowmo_lr factor missing, the next
step's lr, momentum ignored, a rank's portion not updated, no Local SGD
average): each is
reported "caught"; one that passes fails the test.

Usage (ctest runs it; exit 77 when torch is missing):

    /usr/bin/python3 tests/reference/slowmo_ref.py MPIEXEC build/tests/mpi_slowmo
"""
import os
import struct
import subprocess
import sys
import tempfile

import refcheck

torch = refcheck.torch_or_skip("slowmo_ref")

NOISE_K = 8.0
WINDOW = 32
FLOOR_ULPS = 16.0

# (ranks, local optimizer, localsgd_frequency, slowmo_frequency, momentum, slowmo_lr, steps)
CASES = [
    (2, "sgd", 2, 4, 0.5, 0.7, 12),    # 3 outer steps, 3 plain averages, local steps between
    (2, "adamw", 2, 6, 0.6, 1.3, 12),  # 2 outer steps, 4 plain averages
    (3, "sgd", 3, 6, 0.5, 0.7, 12),    # portions of ceil(P / 3): the last one shorter
]

MUTANTS = [
    "outer step of the wrong sign",
    "outer step without the lr factor",
    "outer step without slowmo_lr",
    "slow momentum ignored",
    "last rank's portion not updated",
    "no Local SGD average",
    "outer step with the next step's lr",
]


def read_dump(path):
    with open(path, "rb") as f:
        raw = f.read()
    P, T, W, rank = struct.unpack_from("<4i", raw, 0)
    oc = struct.unpack_from("<9d", raw, 16)
    off = 16 + 72

    def floats(n):
        nonlocal off
        t = torch.frombuffer(bytearray(raw[off:off + 4 * n]), dtype=torch.float32)
        off += 4 * n
        return t

    decay = torch.frombuffer(bytearray(raw[off:off + P]), dtype=torch.uint8).bool()
    off += P
    x0 = floats(P)
    lrs, grads, params = [], [], []
    for _ in range(T):
        lrs.append(struct.unpack_from("<d", raw, off)[0])
        off += 8
        grads.append(floats(P))
        params.append(floats(P))
    if off != len(raw):
        raise ValueError(f"{path}: {len(raw) - off} bytes left over")
    optim = dict(zip(("kind", "lr", "momentum", "dampening", "nesterov", "weight_decay",
                      "beta1", "beta2", "eps"), oc))
    return dict(P=P, T=T, W=W, rank=rank, optim=optim, decay=decay, x0=x0, lrs=lrs,
                grads=grads, params=params)


class LocalOptimizer:
    """One rank's torch optimizer over the flat vector: decayed and
    undecayed elements as two parameter groups."""

    def __init__(self, x0, decay, cfg, dtype):
        self.decay = decay
        self.parts = [x0[decay].to(dtype).clone(), x0[~decay].to(dtype).clone()]
        wd = cfg["weight_decay"]
        groups = [{"params": [self.parts[0]], "weight_decay": wd},
                  {"params": [self.parts[1]], "weight_decay": 0.0}]
        if cfg["kind"] == 0:
            self.opt = torch.optim.SGD(groups, lr=cfg["lr"], momentum=cfg["momentum"],
                                       dampening=cfg["dampening"], nesterov=bool(cfg["nesterov"]))
        else:
            self.opt = torch.optim.AdamW(groups, lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]),
                                         eps=cfg["eps"])

    def step(self, grad, lr):
        for g, p in zip(self.opt.param_groups, self.parts):
            g["lr"] = lr
        self.parts[0].grad = grad[self.decay].to(self.parts[0].dtype)
        self.parts[1].grad = grad[~self.decay].to(self.parts[1].dtype)
        self.opt.step()

    def get(self):
        x = torch.empty(self.decay.numel(), dtype=self.parts[0].dtype)
        x[self.decay], x[~self.decay] = self.parts[0].detach(), self.parts[1].detach()
        return x

    def set(self, x):
        with torch.no_grad():
            self.parts[0].copy_(x[self.decay])
            self.parts[1].copy_(x[~self.decay])


def replay(dumps, case, dtype, mutant=None):
    """Every rank's parameters after every step: out[t][r]."""
    W, _, localsgd, slowmo, beta, alpha, T = case
    d0 = dumps[0]
    P = d0["P"]
    opts = [LocalOptimizer(d0["x0"], d0["decay"], d0["optim"], dtype) for _ in range(W)]
    old = d0["x0"].to(dtype).clone()
    buf = torch.zeros(P, dtype=dtype)
    L = (P + W - 1) // W  # FairScale's world_portion_length
    if mutant == "slow momentum ignored":
        beta = 0.0
    out = []
    for t in range(1, T + 1):
        lr = d0["lrs"][t - 1]
        for r, o in enumerate(opts):
            o.step(dumps[r]["grads"][t - 1], lr)
        if mutant == "outer step with the next step's lr":
            lr = d0["lrs"][min(t, T - 1)]
        xs = [o.get() for o in opts]
        if t % slowmo == 0:
            avg = torch.stack(xs).mean(0)
            new = avg.clone()
            for owner in range(W):
                a, b = owner * L, min((owner + 1) * L, P)
                if a >= b or (mutant == "last rank's portion not updated" and owner == W - 1):
                    continue
                m, p, q = buf[a:b], avg[a:b], old[a:b]
                m.mul_(beta).sub_(p, alpha=1 / lr).add_(q, alpha=1 / lr)
                step = {"outer step of the wrong sign": lr * alpha,
                        "outer step without the lr factor": -alpha,
                        "outer step without slowmo_lr": -lr}.get(mutant, -lr * alpha)
                q.add_(m, alpha=step)
                new[a:b] = q
            xs = [new.clone() for _ in range(W)]
        elif t % localsgd == 0 and mutant != "no Local SGD average":
            avg = torch.stack(xs).mean(0)
            xs = [avg.clone() for _ in range(W)]
        for o, x in zip(opts, xs):
            o.set(x)
        out.append(xs)
    return out


def window_max(x):
    n = x.numel()
    pad = (-n) % WINDOW
    w = torch.nn.functional.pad(x, (0, pad)).reshape(-1, WINDOW).amax(1)
    return w.repeat_interleave(WINDOW)[:n]


def by_step_and_rank(per_step):
    """out[t][r] (vectors of P) as one (T, W, P) float64 tensor."""
    return torch.stack([torch.stack([x.double() for x in per_rank]) for per_rank in per_step])


def run_case(mpiexec, exe, case, tmp):
    W, optim, localsgd, slowmo, beta, alpha, T = case
    name = (f"{W} ranks, {optim}, localsgd {localsgd}, slowmo {slowmo}, momentum {beta}, "
            f"slowmo_lr {alpha}, {T} steps")
    cmd = [mpiexec, "-n", str(W), "--oversubscribe", exe, "--dump", tmp, optim, str(localsgd),
           str(slowmo), str(beta), str(alpha), str(T)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        print(f"{name}: mpi_slowmo --dump failed ({out.returncode}):\n{out.stdout}{out.stderr}")
        return 1
    dumps = [read_dump(os.path.join(tmp, f"rank{r}.bin")) for r in range(W)]
    if any(d["W"] != W or d["T"] != T or d["rank"] != r for r, d in enumerate(dumps)):
        print(f"{name}: the dump's header does not match the run")
        return 1
    got = by_step_and_rank([[d["params"][t] for d in dumps] for t in range(T)])
    ref64 = by_step_and_rank(replay(dumps, case, torch.float64))
    noise = (by_step_and_rank(replay(dumps, case, torch.float32)) - ref64).abs()
    ulp = torch.finfo(torch.float32).eps
    bound = torch.stack([torch.stack([NOISE_K * window_max(e) for e in per_rank])
                         for per_rank in noise]) + FLOOR_ULPS * ulp * ref64.abs() + 1e-30
    ratio, (t, r, i) = refcheck.worst_ratio(got, ref64, bound)
    diff = float((got - ref64).abs().max())
    failed = refcheck.report(
        f"{name}: max |fsc - float64 replay| {diff:.2e}, float32 replay's own "
        f"{float(noise.max()):.2e}; worst {ratio:.3f} of the bound (step {t + 1}, rank {r}, "
        f"element {i})", ratio)
    for mutant in MUTANTS:
        wrong = by_step_and_rank(replay(dumps, case, torch.float64, mutant))
        m_ratio, (mt, mr, _) = refcheck.worst_ratio(got, wrong, bound)
        failed += refcheck.report(
            f"  mutant '{mutant}': {m_ratio:.3g}x the bound (step {mt + 1}, rank {mr})", m_ratio,
            must_fail=True)
    return failed


def main():
    mpiexec, exe = refcheck.arguments("slowmo_ref.py", "MPIEXEC", "PATH/TO/mpi_slowmo")
    torch.set_num_threads(1)
    failed = 0
    for case in CASES:
        with tempfile.TemporaryDirectory(prefix="fsc_slowmo_ref") as tmp:
            failed += run_case(mpiexec, exe, case, tmp)
    return refcheck.exit_status("slowmo_ref", failed, "check(s) failed")


if __name__ == "__main__":
    sys.exit(main())
