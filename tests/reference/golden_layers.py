"""Golden outputs and gradients of every fsc layer, computed by PyTorch.

For each layer, tests/data/golden_<layer>.safetensors holds the input `x`,
the parameters under fsc's full names, a random upstream gradient `dy`, the
output `y`, the input gradient `dx` (where the input is differentiable) and
the parameter gradients as `grad.<name>`. tests/nn/test_golden.c rebuilds each
layer in fsc with the same sizes, loads these values and compares.

Regenerate with Debian's python3 (python3-torch), from anywhere:
    /usr/bin/python3 tests/reference/golden_layers.py
"""
import os

import torch
import torch.nn.functional as F

import goldens as G

# Sizes shared with tests/nn/test_golden.c.
B, T, C, NH = 2, 8, 16, 4  # layers
LIN_OUT = 24
CE_N, CE_V = 12, 20  # cross-entropy rows, classes
GPT_B, GPT_T, GPT_V, GPT_C, GPT_NH, GPT_L = 2, 16, 64, 32, 4, 2


def params_from(shapes, gen, std=0.3, ln=False):
    """Non-trivial values: weights and biases N(0, std), LayerNorm weights 1 + N(0, 0.1)."""
    p = {}
    for name, shape in shapes:
        t = torch.randn(shape, generator=gen)
        is_ln_weight = name.endswith("weight") and (".ln_" in name or name.startswith("ln_") or ln)
        p[name] = 1.0 + 0.1 * t if is_ln_weight else std * t
    return p


def run_layer(layer, fn, x, shapes, gen, x_grad=True, ln=False):
    """fn(x, params) -> y. Saves x, params, dy, y, dx, grad.<name>."""
    p = {k: v.clone().requires_grad_(True) for k, v in params_from(shapes, gen, ln=ln).items()}
    xin = x.clone().requires_grad_(x_grad)
    y = fn(xin, p)
    dy = torch.randn(y.shape, generator=gen)
    y.backward(dy)
    out = {"x": x}
    out.update({k: v.detach() for k, v in p.items()})
    out["dy"] = dy
    out["y"] = y.detach()
    if x_grad:
        out["dx"] = xin.grad
    out.update({"grad." + k: v.grad for k, v in p.items()})
    G.save_safetensors(os.path.join(G.DATA_DIR, f"golden_{layer}.safetensors"), out, G.meta("golden_layers.py"))


def main():
    torch.manual_seed(1234)
    gen = torch.Generator().manual_seed(20240601)
    x = torch.randn(B, T, C, generator=gen)

    run_layer("linear_torch", lambda x, p: G.linear(x, p["weight"], p["bias"], "out_in"), x,
              [("weight", (LIN_OUT, C)), ("bias", (LIN_OUT,))], gen)
    run_layer("linear_conv1d", lambda x, p: G.linear(x, p["weight"], p["bias"], "in_out"), x,
              [("weight", (C, LIN_OUT)), ("bias", (LIN_OUT,))], gen)
    run_layer("layernorm", lambda x, p: G.layernorm(x, p["weight"], p["bias"]), x,
              [("weight", (C,)), ("bias", (C,))], gen, ln=True)
    # activations on a wider range, kept off ReLU's kink
    xa = 3.0 * torch.randn(B, T, C, generator=gen)
    xa = torch.where(xa.abs() < 1e-3, torch.full_like(xa, 0.5), xa)
    run_layer("gelu", lambda x, p: G.gelu(x), xa, [], gen)
    run_layer("relu", lambda x, p: F.relu(x), xa, [], gen)
    run_layer("attention", lambda x, p: G.attention(x, p, "", NH), x,
              [("c_attn.weight", (C, 3 * C)), ("c_attn.bias", (3 * C,)),
               ("c_proj.weight", (C, C)), ("c_proj.bias", (C,))], gen)
    run_layer("mlp", lambda x, p: G.mlp(x, p, ""), x,
              [("c_fc.weight", (C, 4 * C)), ("c_fc.bias", (4 * C,)),
               ("c_proj.weight", (4 * C, C)), ("c_proj.bias", (C,))], gen)
    run_layer("block", lambda x, p: G.block(x, p, "", NH), x, G.block_param_shapes(C), gen)

    # cross-entropy: mean over non-ignored targets; dlogits = d(loss)/d(logits)
    logits = (2.0 * torch.randn(CE_N, CE_V, generator=gen)).requires_grad_(True)
    targets = torch.randint(0, CE_V, (CE_N,), generator=gen, dtype=torch.int32)
    targets[[2, 7]] = -100
    loss = F.cross_entropy(logits, targets.long(), ignore_index=-100)
    loss.backward()
    G.save_safetensors(os.path.join(G.DATA_DIR, "golden_cross_entropy.safetensors"),
                       {"logits": logits.detach(), "targets": targets, "loss": loss.detach().reshape(1),
                        "dlogits": logits.grad}, G.meta("golden_layers.py"))

    # 2-layer GPT: logits, and every parameter gradient of the mean cross-entropy
    shapes = G.gpt_param_shapes(GPT_V, GPT_T, GPT_L, GPT_C)
    p = {k: v.requires_grad_(True) for k, v in params_from(shapes, gen, std=0.1).items()}
    ids = torch.randint(0, GPT_V, (GPT_B, GPT_T), generator=gen, dtype=torch.int32)
    tgt = torch.randint(0, GPT_V, (GPT_B, GPT_T), generator=gen, dtype=torch.int32)
    tgt[0, 3] = tgt[1, 15] = -100
    logits, loss = G.gpt_loss(ids, tgt, p, GPT_L, GPT_NH)
    loss.backward()
    out = {"x": ids, "targets": tgt}
    out.update({k: v.detach() for k, v in p.items()})
    out["logits"] = logits.detach()
    out["loss"] = loss.detach().reshape(1)
    out.update({"grad." + k: v.grad for k, v in p.items()})
    G.save_safetensors(os.path.join(G.DATA_DIR, "golden_gpt.safetensors"), out, G.meta("golden_layers.py"))


if __name__ == "__main__":
    main()
