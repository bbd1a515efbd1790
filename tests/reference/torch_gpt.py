"""A GPT-2 in PyTorch with the Hugging Face parameter names and layouts.

Shared by the reference scripts and the cross-check tests: it loads and saves
the safetensors files fsc writes (Conv1D weights are (in, out), the LM head is
tied to wte), and implements fsc's data order and learning-rate schedule.
"""
import json
import math
import struct

import torch
import torch.nn.functional as F

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


def save_safetensors(path, tensors, metadata=None):
    names = list(tensors)
    header, offset, blobs = {}, 0, []
    for k in names:
        t = tensors[k].contiguous()
        dt = {v: k2 for k2, v in DTYPES.items()}[t.dtype]
        raw = t.numpy().tobytes()
        header[k] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


class GPT(torch.nn.Module):
    def __init__(self, vocab, seq, layers, d_model, heads):
        super().__init__()
        self.V, self.T, self.L, self.C, self.NH = vocab, seq, layers, d_model, heads
        C = d_model
        p = {"wte.weight": (vocab, C), "wpe.weight": (seq, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
        for i in range(layers):
            h = f"h.{i}."
            p.update({h + "ln_1.weight": (C,), h + "ln_1.bias": (C,),
                      h + "attn.c_attn.weight": (C, 3 * C), h + "attn.c_attn.bias": (3 * C,),
                      h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
                      h + "ln_2.weight": (C,), h + "ln_2.bias": (C,),
                      h + "mlp.c_fc.weight": (C, 4 * C), h + "mlp.c_fc.bias": (4 * C,),
                      h + "mlp.c_proj.weight": (4 * C, C), h + "mlp.c_proj.bias": (C,)})
        self.names = list(p)
        self.params = torch.nn.ParameterDict(
            {k.replace(".", "__"): torch.nn.Parameter(torch.zeros(s)) for k, s in p.items()})

    def p(self, name):
        return self.params[name.replace(".", "__")]

    def load(self, tensors):
        with torch.no_grad():
            for k in self.names:
                src = tensors.get(k, tensors.get("transformer." + k))
                if src is None:
                    raise KeyError(f"missing tensor {k}")
                self.p(k).copy_(src.float())

    def state(self):
        return {k: self.p(k).detach().clone() for k in self.names}

    def forward(self, idx):
        B, T = idx.shape
        C, NH = self.C, self.NH
        x = self.p("wte.weight")[idx] + self.p("wpe.weight")[:T]
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        for i in range(self.L):
            h = f"h.{i}."
            a = F.layer_norm(x, (C,), self.p(h + "ln_1.weight"), self.p(h + "ln_1.bias"), 1e-5)
            qkv = a @ self.p(h + "attn.c_attn.weight") + self.p(h + "attn.c_attn.bias")
            q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in qkv.split(C, dim=2))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
            att = att.masked_fill(mask, float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + y @ self.p(h + "attn.c_proj.weight") + self.p(h + "attn.c_proj.bias")
            m = F.layer_norm(x, (C,), self.p(h + "ln_2.weight"), self.p(h + "ln_2.bias"), 1e-5)
            m = F.gelu(m @ self.p(h + "mlp.c_fc.weight") + self.p(h + "mlp.c_fc.bias"),
                       approximate="tanh")
            x = x + m @ self.p(h + "mlp.c_proj.weight") + self.p(h + "mlp.c_proj.bias")
        x = F.layer_norm(x, (C,), self.p("ln_f.weight"), self.p("ln_f.bias"), 1e-5)
        return x @ self.p("wte.weight").t()

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
