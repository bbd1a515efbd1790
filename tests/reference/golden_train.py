"""Golden training run: 20 AdamW steps of a 2-layer GPT, computed by PyTorch.

tests/data/golden_train.safetensors holds the initial parameters under fsc's
names, the token batches `x`, `y` (steps, B, T) int32, the per-step losses
`losses` (steps) and the final parameters as `final.<name>`.
tests/nn/test_golden.c trains fsc's GPT from the same start on the same batches
with its AdamW and compares every loss and the final parameters.

The optimizer is torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.95), eps=1e-8,
weight_decay=0.1) with decay only on parameters of >= 2 dims (fsc's default
weight_decay flag), via two parameter groups.

Regenerate with Debian's python3 (python3-torch):
    /usr/bin/python3 tests/reference/golden_train.py
"""
import os

import torch

import goldens as G

# Sizes and hyper-parameters shared with tests/nn/test_golden.c.
V, T, C, NH, L = 64, 16, 32, 4, 2
B, STEPS = 4, 20
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.1


def make_batches(gen):
    """Learnable token streams: each token follows a fixed successor table with
    probability 0.75, else is uniform, so the loss falls over 20 steps."""
    succ = torch.randperm(V, generator=gen)
    n = STEPS * B * (T + 1)
    toks = torch.empty(n, dtype=torch.int64)
    toks[0] = 0
    coin = torch.rand(n, generator=gen)
    rand = torch.randint(0, V, (n,), generator=gen)
    for i in range(1, n):
        toks[i] = succ[toks[i - 1]] if coin[i] < 0.75 else rand[i]
    rows = toks.view(STEPS, B, T + 1)
    return rows[:, :, :T].to(torch.int32).contiguous(), rows[:, :, 1:].to(torch.int32).contiguous()


def main():
    torch.manual_seed(4321)
    gen = torch.Generator().manual_seed(20240602)
    shapes = G.gpt_param_shapes(V, T, L, C)
    init = G.gpt2_init(shapes, L, gen)
    x, y = make_batches(gen)

    p = {k: v.clone().requires_grad_(True) for k, v in init.items()}
    decay = [t for t in p.values() if t.dim() >= 2]
    no_decay = [t for t in p.values() if t.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    losses = []
    for s in range(STEPS):
        opt.zero_grad(set_to_none=False)
        _, loss = G.gpt_loss(x[s], y[s], p, L, NH)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print("losses:", " ".join(f"{v:.4f}" for v in losses))

    out = dict(init)
    out["x"], out["y"] = x, y
    out["losses"] = torch.tensor(losses, dtype=torch.float32)
    out.update({"final." + k: v.detach() for k, v in p.items()})
    G.save_safetensors(os.path.join(G.DATA_DIR, "golden_train.safetensors"), out, G.meta("golden_train.py"))


if __name__ == "__main__":
    main()
