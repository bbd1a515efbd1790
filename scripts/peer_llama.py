"""peer_llama.py: the LLaMA of fsc-bench --arch llama, in plain PyTorch 1.13
ops (which has no LLaMA class), for scripts/peer_bench.py --arch llama.

Hugging Face's LlamaForCausalLM semantics: pre-norm decoder layers of
RMSNorm (computed in fp32, cast back, then scaled by its weight), causal
self-attention with rotary embeddings in the rotate-half convention and
grouped key/value heads (each KV head repeated for its query heads, as
repeat_kv does), a SwiGLU MLP (down(silu(gate(x)) * up(x))), no biases, a
final RMSNorm and an untied LM head. Every Linear and the embedding start
from N(0, 0.02), the norms at 1. The model exposes embedding, blocks and
head, as peer_bench.py's GPT, so every strategy there wraps it unchanged.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_tables(T, hd, theta):
    """cos, sin (T, hd): the angle of position t at frequency i is the fp32
    product t * theta^(-2i/hd), repeated for both halves of the head."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2).float() / hd))
    angle = torch.arange(T).float()[:, None] * inv_freq[None, :]
    both = torch.cat((angle, angle), dim=-1)
    return both.cos(), both.sin()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, C, NH, NKV, T, theta):
        super().__init__()
        self.NH, self.NKV, self.hd = NH, NKV, C // NH
        self.q_proj = nn.Linear(C, NH * self.hd, bias=False)
        self.k_proj = nn.Linear(C, NKV * self.hd, bias=False)
        self.v_proj = nn.Linear(C, NKV * self.hd, bias=False)
        self.o_proj = nn.Linear(NH * self.hd, C, bias=False)
        # plain attributes, not buffers: DDP would broadcast them, and gloo has no bool
        self.cos, self.sin = rope_tables(T, self.hd, theta)
        self.future = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)

    def forward(self, x):  # x is (B,T,C)
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.NH, self.hd).transpose(1, 2)  # (B,NH,T,hd)
        k = self.k_proj(x).view(B, T, self.NKV, self.hd).transpose(1, 2)  # (B,NKV,T,hd)
        v = self.v_proj(x).view(B, T, self.NKV, self.hd).transpose(1, 2)
        cos, sin = self.cos[:T], self.sin[:T]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.NH // self.NKV  # query head h reads KV head h // rep
        k = k[:, :, None].expand(B, self.NKV, rep, T, self.hd).reshape(B, self.NH, T, self.hd)
        v = v[:, :, None].expand(B, self.NKV, rep, T, self.hd).reshape(B, self.NH, T, self.hd)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
        scores = scores.masked_fill(self.future[:T, :T], float("-inf"))
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return self.o_proj((probs @ v).transpose(1, 2).reshape(B, T, self.NH * self.hd))


class SwiGLU(nn.Module):
    def __init__(self, C, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(C, hidden, bias=False)
        self.up_proj = nn.Linear(C, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, C, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, C, NH, NKV, T, hidden, theta, eps):
        super().__init__()
        self.input_layernorm = RMSNorm(C, eps)
        self.self_attn = Attention(C, NH, NKV, T, theta)
        self.post_attention_layernorm = RMSNorm(C, eps)
        self.mlp = SwiGLU(C, hidden)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Embedding(nn.Module):
    def __init__(self, V, C):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, C)

    def forward(self, idx):  # idx is (B,T) token ids; RoPE carries the positions
        return self.embed_tokens(idx)


class Head(nn.Module):
    def __init__(self, C, V, eps):
        super().__init__()
        self.norm = RMSNorm(C, eps)
        self.lm_head = nn.Linear(C, V, bias=False)

    def forward(self, x):
        return self.lm_head(self.norm(x))


class Llama(nn.Module):
    """a: layers, d_model, heads, kv_heads, ffn_hidden, seq, vocab."""

    def __init__(self, a, theta=10000.0, eps=1e-5):
        super().__init__()
        self.embedding = Embedding(a.vocab, a.d_model)
        self.blocks = nn.ModuleList(
            Block(a.d_model, a.heads, a.kv_heads, a.seq, a.ffn_hidden, theta, eps) for _ in range(a.layers))
        self.head = Head(a.d_model, a.vocab, eps)
        for m in self.modules():  # Hugging Face's initializer_range 0.02
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)

    def layers(self):
        """The model as a list a pipeline cuts: embedding, blocks, head."""
        return [self.embedding, *self.blocks, self.head]

    def logits(self, idx):
        x = self.embedding(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(x)

    def forward(self, idx, targets):
        logits = self.logits(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def hf_state_dict(self):
        """The parameters under Hugging Face's LlamaForCausalLM names."""
        rename = (("embedding.", "model."), ("blocks.", "model.layers."), ("head.norm.", "model.norm."),
                  ("head.lm_head.", "lm_head."))
        out = {}
        for name, p in self.named_parameters():
            for old, new in rename:
                if name.startswith(old):
                    name = new + name[len(old):]
                    break
            out[name] = p.detach()
        return out


def num_params(a):
    """fsc_gpt_num_params for the LLaMA family (untied head, no biases)."""
    C, hd = a.d_model, a.d_model // a.heads
    per_layer = 2 * C + 2 * C * a.heads * hd + 2 * C * a.kv_heads * hd + 3 * C * a.ffn_hidden
    return 2 * a.vocab * C + a.layers * per_layer + C


def flops_per_token(a, params):
    """fsc_gpt_flops_per_token for the LLaMA family: 6 per weight that a GEMM
    uses (all but the embedding's lookup table; so SwiGLU's three and the
    narrower k/v projections count as they are), plus attention's 12 L C T."""
    return 6 * (params - a.vocab * a.d_model) + 12 * a.layers * a.d_model * a.seq
