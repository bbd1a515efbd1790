"""LoRA on the plain-torch LLaMA (torch_llama.py), as Hugging Face PEFT
trains it: every base tensor frozen, each adapted Linear's weight W seen as
W + (alpha / r) B A with A (r, in) and B (out, r) the trained tensors, by
fsc's names ("...q_proj.lora_A.weight"). PEFT computes x W^T + s (x A^T) B^T;
in exact arithmetic that is x (W + s B A)^T, and autograd gives A and B the
same gradients either way, so the float results agree to rounding."""
import torch

import torch_llama


class LoraLlama(torch_llama.Llama):
    def __init__(self, tensors, rank, alpha, **kw):
        base = {n: t for n, t in tensors.items() if ".lora_" not in n}
        super().__init__(base, **kw)
        for p in self.params:
            p.requires_grad_(False)
        self.scale = alpha / rank
        names = [n for n in tensors if n.endswith(".lora_A.weight")]
        self.adapters = torch.nn.ParameterList()
        self.adapted = {}
        for a in names:
            stem = a[: -len(".lora_A.weight")]
            A = torch.nn.Parameter(tensors[a].clone().float())
            B = torch.nn.Parameter(tensors[stem + ".lora_B.weight"].clone().float())
            self.adapters.append(A)
            self.adapters.append(B)
            self.adapted[stem + ".weight"] = (A, B)

    def p(self, name):
        w = super().p(name)
        if name in self.adapted:
            A, B = self.adapted[name]
            return w + self.scale * (B @ A)
        return w

    def adamw(self, lr, betas, eps, weight_decay):
        """AdamW over the adapters alone (2-D, so decayed as fsc decays them)."""
        return torch.optim.AdamW(list(self.adapters), lr=lr, betas=betas, eps=eps,
                                 weight_decay=weight_decay, foreach=False)
