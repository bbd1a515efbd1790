"""Shared pieces of the golden generators: a safetensors writer (so the
goldens need nothing beyond torch and numpy) and a tiny GPT-2 in torch with
the Hugging Face parameter names and layouts, which are also fsc's.

Run the generators with Debian's python3 (python3-torch):
    /usr/bin/python3 tests/reference/golden_layers.py
    /usr/bin/python3 tests/reference/golden_train.py
"""
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")


def save_safetensors(path, tensors, metadata=None):
    """tensors: ordered dict name -> torch tensor (float32 -> F32, int -> I32)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().cpu()
        if t.dtype.is_floating_point:
            arr, dt = t.to(torch.float32).numpy().astype("<f4"), "F32"
        else:
            arr, dt = t.to(torch.int32).numpy().astype("<i4"), "I32"
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * (-len(hj) % 8)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
    print(f"wrote {os.path.basename(path)} ({os.path.getsize(path)} bytes, {len(tensors)} tensors)")


# ---- fsc semantics, in torch --------------------------------------------------

def linear(x, w, b, layout):
    """layout "out_in": torch nn.Linear weight (out,in); "in_out": GPT-2 Conv1D (in,out)."""
    y = x @ (w.t() if layout == "out_in" else w)
    return y + b if b is not None else y


def gelu(x):
    return F.gelu(x, approximate="tanh")


def layernorm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def attention(x, p, prefix, NH):
    B, T, C = x.shape
    hs = C // NH
    qkv = linear(x, p[prefix + "c_attn.weight"], p[prefix + "c_attn.bias"], "in_out")
    q, k, v = qkv.split(C, dim=2)
    q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v))
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    h = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
    return linear(h, p[prefix + "c_proj.weight"], p[prefix + "c_proj.bias"], "in_out")


def mlp(x, p, prefix):
    h = gelu(linear(x, p[prefix + "c_fc.weight"], p[prefix + "c_fc.bias"], "in_out"))
    return linear(h, p[prefix + "c_proj.weight"], p[prefix + "c_proj.bias"], "in_out")


def block(x, p, prefix, NH):
    x = x + attention(layernorm(x, p[prefix + "ln_1.weight"], p[prefix + "ln_1.bias"]), p, prefix + "attn.", NH)
    return x + mlp(layernorm(x, p[prefix + "ln_2.weight"], p[prefix + "ln_2.bias"]), p, prefix + "mlp.")


def block_param_shapes(C, prefix=""):
    return [
        (prefix + "ln_1.weight", (C,)), (prefix + "ln_1.bias", (C,)),
        (prefix + "attn.c_attn.weight", (C, 3 * C)), (prefix + "attn.c_attn.bias", (3 * C,)),
        (prefix + "attn.c_proj.weight", (C, C)), (prefix + "attn.c_proj.bias", (C,)),
        (prefix + "ln_2.weight", (C,)), (prefix + "ln_2.bias", (C,)),
        (prefix + "mlp.c_fc.weight", (C, 4 * C)), (prefix + "mlp.c_fc.bias", (4 * C,)),
        (prefix + "mlp.c_proj.weight", (4 * C, C)), (prefix + "mlp.c_proj.bias", (C,)),
    ]


def gpt_param_shapes(V, T, L, C):
    """Names and shapes in fsc's fsc_params_bind order (Hugging Face GPT-2 names)."""
    shapes = [("wte.weight", (V, C)), ("wpe.weight", (T, C))]
    for l in range(L):
        shapes += block_param_shapes(C, f"h.{l}.")
    return shapes + [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]


def gpt_logits(ids, p, L, NH):
    B, T = ids.shape
    x = p["wte.weight"][ids.long()] + p["wpe.weight"][:T]
    for l in range(L):
        x = block(x, p, f"h.{l}.", NH)
    x = layernorm(x, p["ln_f.weight"], p["ln_f.bias"])
    return x @ p["wte.weight"].t()  # LM head tied to wte


def gpt_loss(ids, targets, p, L, NH):
    logits = gpt_logits(ids, p, L, NH)
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1).long(), ignore_index=-100)
    return logits, loss


def gpt2_init(shapes, L, gen):
    """GPT-2's initialisation (as fsc's): N(0, 0.02), residual projections
    N(0, 0.02/sqrt(2L)), LayerNorm weights 1, biases 0."""
    p = {}
    for name, shape in shapes:
        if name.endswith("bias"):
            t = torch.zeros(shape)
        elif ".ln_" in name or name.startswith("ln_"):
            t = torch.ones(shape)
        else:
            std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") else 0.02
            t = torch.randn(shape, generator=gen) * std
        p[name] = t
    return p


def meta(script):
    return {"generator": f"tests/reference/{script}", "torch": torch.__version__}
