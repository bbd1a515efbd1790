"""A LLaMA-family model in plain torch ops (torch 1.13 has none), with
Hugging Face's LlamaForCausalLM names: golden_llama.py's layers (RMSNorm,
rotate-half rotary embeddings, grouped-query attention, SwiGLU) stacked as
LlamaModel stacks them, for the cross-checks of fsc-train --arch llama."""
import torch
import torch.nn.functional as F

import golden_llama as layers


class Llama(torch.nn.Module):
    """Every tensor of a state dict as a trainable parameter, by HF name."""

    def __init__(self, tensors, layers_, heads, kv_heads, theta=10000.0, eps=1e-5, scaling=None,
                 dtype=torch.float32):
        """scaling: config.json's rope_scaling (llama3) or None; dtype: the
        parameters' and so the whole forward's (float64 for a noise floor)."""
        super().__init__()
        self.L, self.NH, self.NKV, self.theta, self.eps = layers_, heads, kv_heads, theta, eps
        self.scaling = scaling
        self.names = list(tensors)
        self.params = torch.nn.ParameterList(
            [torch.nn.Parameter(tensors[n].clone().to(dtype)) for n in self.names])
        self.index = {n: i for i, n in enumerate(self.names)}

    def p(self, name):
        return self.params[self.index[name]]

    def sub(self, prefix):
        """The parameters under prefix, named from there (golden_llama's dicts)."""
        return {n[len(prefix):]: self.p(n) for n in self.names if n.startswith(prefix)}

    def mlp(self, m, pre):
        """Layer pre's MLP on m: (its output, its load-balancing term or None);
        torch_mixtral.py's layers answer with a mixture of experts."""
        return layers.swiglu(m, self.sub(pre + "mlp.")), None

    def forward_aux(self, x):
        """(logits, the load-balancing terms of the MLPs summed over layers)."""
        h = self.p("model.embed_tokens.weight")[x]
        C = h.shape[-1]
        hd = C // self.NH
        aux = torch.zeros(())
        for i in range(self.L):
            pre = f"model.layers.{i}."
            a = layers.rms_norm(h, self.p(pre + "input_layernorm.weight"), self.eps)
            h = h + layers.llama_attention(a, self.sub(pre + "self_attn."), self.NH, self.NKV, hd,
                                           self.theta, self.scaling,
                                           pre + "self_attn.q_proj.bias" in self.index)
            m = layers.rms_norm(h, self.p(pre + "post_attention_layernorm.weight"), self.eps)
            y, l_aux = self.mlp(m, pre)
            if l_aux is not None:
                aux = aux + l_aux
            h = h + y
        h = layers.rms_norm(h, self.p("model.norm.weight"), self.eps)
        head = self.p("lm_head.weight") if "lm_head.weight" in self.index else \
            self.p("model.embed_tokens.weight")
        return h @ head.t(), aux

    def logits(self, x):
        return self.forward_aux(x)[0]

    def loss(self, x, y):
        lg = self.logits(x)
        return F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1))
