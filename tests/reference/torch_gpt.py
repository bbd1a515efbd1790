"""fsc's training semantics in PyTorch, for the cross-check tests: a GPT-2
(goldens.py's, with the Hugging Face names and layouts) as trainable
parameters, a safetensors reader for the files fsc writes, fsc's data order,
its learning-rate schedules, and AdamW with fsc's decay rule.
"""
import json
import math
import struct

import torch
import torch.nn.functional as F

import goldens

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
          "I32": torch.int32, "I64": torch.int64}


def load_safetensors(path):
    """Returns ({name: tensor}, metadata) for a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:end]), dtype=DTYPES[e["dtype"]]) if end > b else \
            torch.zeros(0, dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"]).clone()
    return out, meta


class GPT(torch.nn.Module):
    """goldens.py's functional GPT-2 held as trainable parameters."""

    def __init__(self, vocab, seq, layers, d_model, heads):
        super().__init__()
        self.V, self.L, self.NH = vocab, layers, heads
        shapes = goldens.gpt_param_shapes(vocab, seq, layers, d_model)
        self.names = [k for k, _ in shapes]
        self.params = torch.nn.ParameterDict(
            {k.replace(".", "__"): torch.nn.Parameter(torch.zeros(s)) for k, s in shapes})

    def p(self, name):
        return self.params[name.replace(".", "__")]

    def load(self, tensors):
        with torch.no_grad():
            for k in self.names:
                src = tensors.get(k, tensors.get("transformer." + k))
                if src is None:
                    raise KeyError(f"missing tensor {k}")
                self.p(k).copy_(src.float())

    def forward(self, idx):
        return goldens.gpt_logits(idx, {k: self.p(k) for k in self.names}, self.L, self.NH)

    def loss(self, x, y):
        logits = self(x)
        return F.cross_entropy(logits.reshape(-1, self.V), y.reshape(-1).long())


def batch(tokens, step, micro, rank, batch, accum, dp, T):
    """fsc's data order (README, 'Data order'): returns x, y as (batch, T) int64."""
    G = batch * accum * dp
    first = step * G + micro * batch * dp + rank * batch
    n = len(tokens)
    xs, ys = [], []
    for s in range(first, first + batch):
        idx = [(s * T + j) % n for j in range(T + 1)]
        w = tokens[idx]
        xs.append(w[:-1])
        ys.append(w[1:])
    return torch.stack(xs).long(), torch.stack(ys).long()


def lr_at(step, max_lr, warmup, total, min_ratio, kind="cosine"):
    """fsc's schedules (include/fsc/optim.h, fsc_lr_schedule)."""
    if kind == "constant":
        return max_lr
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if kind == "warmup-constant":
        return max_lr
    lo = min_ratio * max_lr
    if step >= total:
        return lo
    return lo + (max_lr - lo) * (1 + math.cos(math.pi * (step - warmup) / (total - warmup))) / 2


def adamw(model, lr, betas, eps, weight_decay):
    decay = [model.p(k) for k in model.names if model.p(k).dim() >= 2]
    rest = [model.p(k) for k in model.names if model.p(k).dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=betas, eps=eps, foreach=False)
