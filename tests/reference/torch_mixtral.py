"""A Mixtral-style LLaMA in plain torch ops (torch 1.13 has no Mixtral), with
Hugging Face's MixtralForCausalLM names: torch_llama.py's decoder layers whose
MLP, where the state dict has model.layers.{i}.block_sparse_moe.gate.weight,
is a top-2 mixture of SwiGLU experts (experts.{j}.w1 the gate, w3 the up,
w2 the down projection). Routing as Mixtral's: softmax over the bias-free
gate's logits, the two largest, their weights renormalised to sum to 1,
nothing dropped. Written independently of fsc's dispatch buffers: each
expert runs on the tokens that chose it, its output scattered back.

The load-balancing term is fsc's (fsc/moe.h: GShard's, per sequence,
l_aux = E * mean_e(first-choice fraction_e * mean gate probability_e)),
averaged over the batch's sequences, times aux_coef, summed over MoE layers:
added to the objective, not to the reported loss, as fsc-train reports it."""
import torch
import torch.nn.functional as F

import torch_llama


def expert(x, p):
    return (F.silu(x @ p["w1.weight"].t()) * (x @ p["w3.weight"].t())) @ p["w2.weight"].t()


def sparse_moe(x, p, E):
    """x (B,T,C) -> (y (B,T,C), mean over rows of l_aux)."""
    B, T, C = x.shape
    flat = x.reshape(-1, C)
    gates = F.softmax(flat @ p["gate.weight"].t(), dim=-1)
    w, idx = torch.topk(gates, 2, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    y = torch.zeros_like(flat)
    for e in range(E):
        tok, k = torch.where(idx == e)
        if tok.numel():
            out = expert(flat[tok], {n: p[f"experts.{e}.{n}"] for n in
                                     ("w1.weight", "w2.weight", "w3.weight")})
            y = y.index_add(0, tok, out * w[tok, k, None])
    first = F.one_hot(idx[:, 0], E).float().reshape(B, T, E).mean(1)  # (B, E)
    me = gates.reshape(B, T, E).mean(1)
    aux = (E * (first * me).mean(1)).mean()
    return y.reshape(B, T, C), aux


class Mixtral(torch_llama.Llama):
    def __init__(self, tensors, experts, aux_coef, **kw):
        super().__init__(tensors, **kw)
        self.E, self.aux_coef = experts, aux_coef

    def mlp(self, m, pre):
        """A mixture of experts where the state dict has the layer's gate."""
        if pre + "block_sparse_moe.gate.weight" in self.index:
            return sparse_moe(m, self.sub(pre + "block_sparse_moe."), self.E)
        return super().mlp(m, pre)

    def objective(self, x, y):
        """(what backward runs on, the cross-entropy reported)."""
        lg, aux = self.forward_aux(x)
        ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1))
        return ce + self.aux_coef * aux, ce
