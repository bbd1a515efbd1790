"""Golden outputs and gradients of fsc's LLaMA layers, computed by PyTorch.

Debian's torch 1.13 has no LLaMA, so the layers are written here in plain
torch ops with Hugging Face's semantics: RMSNorm ((x * rsqrt(mean(x^2) +
eps)) * w), rotary embeddings in the rotate-half convention (inverse
frequencies in fp32 as HF computes them, LLaMA-3.1's rope_scaling, angles
the fp32 product position * frequency), the SwiGLU MLP, and causal
self-attention with grouped key/value heads (repeat_kv: query head h reads
key/value head h // (n_heads / n_kv_heads)), optional q/k/v biases, scores
scaled by 1/sqrt(head_dim).

Each tests/data/golden_llama_<case>.safetensors holds what
golden_layers.py's files hold (x, parameters under fsc's names, dy, y, dx,
grad.<name>) and, for every compared tensor, noise.<name>: the largest
|fp32 - fp64| of torch's own result, the same layer evaluated again in
float64 on the same (fp32) inputs. tests/nn/test_llama_golden.c sets each
tensor's tolerance from it. The fp64 evaluation keeps the model's own
fp32 constants (inverse frequencies, rotary angles): they are part of the
definition every implementation shares, not rounding error.

Regenerate with Debian's python3 (python3-torch), from anywhere:
    /usr/bin/python3 tests/reference/golden_llama.py
"""
import math
import os

import torch

import goldens as G

# Sizes shared with tests/nn/test_llama_golden.c.
B, T, C = 2, 8, 16
FFN = 40
AC, ANH, AHD = 32, 4, 8  # attention: d_model, heads, head_dim
LLAMA31 = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)


def rms_norm(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return (x * torch.rsqrt(var + eps)) * w


def rope_inv_freq(hd, theta, scaling):
    """fp32, as Hugging Face computes it (default and "llama3" rope types)."""
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    if scaling is None:
        return inv
    factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / lo, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / hi) * ~(wavelen > old / lo)
    return torch.where(medium, blended, scaled)


def rope_tables(T, hd, theta, scaling, pos0, dtype):
    """cos, sin (T, hd): angles as the fp32 product, then cos/sin in dtype."""
    inv = rope_inv_freq(hd, theta, scaling)
    pos = torch.arange(pos0, pos0 + T, dtype=torch.int64).float()
    ang = pos[:, None] * inv[None, :]
    emb = torch.cat((ang, ang), dim=-1).to(dtype)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x, cos, sin):
    """x (B, H, T, hd); cos, sin (T, hd)."""
    return x * cos + rotate_half(x) * sin


def rope_layer(x, H, hd, theta, scaling, pos0):
    Bx, Tx, _ = x.shape
    cos, sin = rope_tables(Tx, hd, theta, scaling, pos0, x.dtype)
    h = x.view(Bx, Tx, H, hd).transpose(1, 2)
    return apply_rope(h, cos, sin).transpose(1, 2).reshape(Bx, Tx, H * hd)


def swiglu(x, p):
    g = x @ p["gate_proj.weight"].t()
    u = x @ p["up_proj.weight"].t()
    return (torch.nn.functional.silu(g) * u) @ p["down_proj.weight"].t()


def llama_attention(x, p, NH, NKV, hd, theta, scaling, bias):
    Bx, Tx, _ = x.shape

    def proj(name, heads):
        y = x @ p[name + ".weight"].t()
        if bias:
            y = y + p[name + ".bias"]
        return y.view(Bx, Tx, heads, hd).transpose(1, 2)

    q, k, v = proj("q_proj", NH), proj("k_proj", NKV), proj("v_proj", NKV)
    cos, sin = rope_tables(Tx, hd, theta, scaling, 0, x.dtype)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k = k.repeat_interleave(NH // NKV, dim=1)  # repeat_kv's order
    v = v.repeat_interleave(NH // NKV, dim=1)
    att = (q @ k.transpose(-2, -1)) * hd ** -0.5
    mask = torch.tril(torch.ones(Tx, Tx, dtype=torch.bool))
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    h = (att @ v).transpose(1, 2).reshape(Bx, Tx, NH * hd)
    return h @ p["o_proj.weight"].t()


def attention_shapes(NH, NKV, hd, bias):
    s = [("q_proj.weight", (NH * hd, AC))]
    s += [("q_proj.bias", (NH * hd,))] if bias else []
    s += [("k_proj.weight", (NKV * hd, AC))]
    s += [("k_proj.bias", (NKV * hd,))] if bias else []
    s += [("v_proj.weight", (NKV * hd, AC))]
    s += [("v_proj.bias", (NKV * hd,))] if bias else []
    return s + [("o_proj.weight", (AC, NH * hd))]


def evaluate(fn, x, p, dy):
    """y, dx and parameter gradients of fn at x, p (in their dtype)."""
    pp = {k: v.clone().requires_grad_(True) for k, v in p.items()}
    xin = x.clone().requires_grad_(True)
    y = fn(xin, pp)
    y.backward(dy)
    out = {"y": y.detach(), "dx": xin.grad}
    out.update({"grad." + k: v.grad for k, v in pp.items()})
    return out


def run_case(case, fn, x, shapes, gen, norm_weights=()):
    p = {}
    for name, shape in shapes:
        t = torch.randn(shape, generator=gen)
        p[name] = 1.0 + 0.1 * t if name in norm_weights else 0.3 * t
    y_shape = fn(x, p).shape
    dy = torch.randn(y_shape, generator=gen)
    r32 = evaluate(fn, x, p, dy)
    r64 = evaluate(fn, x.double(), {k: v.double() for k, v in p.items()}, dy.double())
    out = {"x": x}
    out.update(p)
    out["dy"] = dy
    out.update(r32)
    for k in r32:
        out["noise." + k] = (r32[k].double() - r64[k]).abs().max().reshape(1)
    G.save_safetensors(os.path.join(G.DATA_DIR, f"golden_llama_{case}.safetensors"), out,
                       G.meta("golden_llama.py"))
    print("  torch fp32 noise: " + ", ".join(f"{k} {float(out['noise.' + k]):.3g}" for k in r32))


def main():
    torch.manual_seed(1234)
    gen = torch.Generator().manual_seed(20250125)
    x = torch.randn(B, T, C, generator=gen)
    xa = torch.randn(B, T, AC, generator=gen)

    run_case("rmsnorm", lambda x, p: rms_norm(x, p["weight"], 1e-5), x, [("weight", (C,))], gen,
             norm_weights=("weight",))
    # positions 8000..8007 with LLaMA-3.1 scaling at theta 500000, head_dim 8:
    # the four frequencies fall in all three bands (wavelengths 6.3, 167,
    # 4443, 118000 against 2048 and 8192)
    run_case("rope_llama31", lambda x, p: rope_layer(x, ANH, AHD, 500000.0, LLAMA31, 8000), xa, [], gen)
    run_case("rope_plain", lambda x, p: rope_layer(x, 1, C, 10000.0, None, 0), x, [], gen)
    run_case("swiglu", swiglu, x,
             [("gate_proj.weight", (FFN, C)), ("up_proj.weight", (FFN, C)), ("down_proj.weight", (C, FFN))], gen)
    run_case("attention_gqa",
             lambda x, p: llama_attention(x, p, ANH, 2, AHD, 500000.0, LLAMA31, True), xa,
             attention_shapes(ANH, 2, AHD, True), gen)
    run_case("attention_mqa",
             lambda x, p: llama_attention(x, p, ANH, 1, AHD, 10000.0, None, False), xa,
             attention_shapes(ANH, 1, AHD, False), gen)


if __name__ == "__main__":
    main()
