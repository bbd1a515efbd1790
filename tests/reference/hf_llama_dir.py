"""Hugging Face LLaMA model directories in plain Python (torch 1.13 and no
transformers): write one as save_pretrained lays it out (config.json,
model-0000k-of-0000n.safetensors shards and model.safetensors.index.json, in
float32 or bfloat16), and read one back (one model.safetensors or the shards
the index names) into a torch_llama.Llama. What the fsc-train / fsc-sample
directory tests run against."""
import json
import os
import struct

import torch

import torch_gpt
import torch_llama

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
NAMES = {v: k for k, v in DTYPES.items()}
TORCH_DTYPE = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def random_llama(V, C, L, NH, NKV, F, bias, tied, seed):
    """A state dict of HF names with N(0, 0.2) weights and RMSNorm gains near 1."""
    g = torch.Generator().manual_seed(seed)
    hd = C // NH
    out = {"model.embed_tokens.weight": torch.randn(V, C, generator=g) * 0.5}
    for i in range(L):
        pre = f"model.layers.{i}."
        out[pre + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
        for name, rows in (("q_proj", NH * hd), ("k_proj", NKV * hd), ("v_proj", NKV * hd)):
            out[pre + f"self_attn.{name}.weight"] = torch.randn(rows, C, generator=g) * 0.2
            if bias:
                out[pre + f"self_attn.{name}.bias"] = torch.randn(rows, generator=g) * 0.1
        out[pre + "self_attn.o_proj.weight"] = torch.randn(C, NH * hd, generator=g) * 0.2
        out[pre + "post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
        out[pre + "mlp.gate_proj.weight"] = torch.randn(F, C, generator=g) * 0.2
        out[pre + "mlp.up_proj.weight"] = torch.randn(F, C, generator=g) * 0.2
        out[pre + "mlp.down_proj.weight"] = torch.randn(C, F, generator=g) * 0.2
    out["model.norm.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
    if not tied:
        out["lm_head.weight"] = torch.randn(V, C, generator=g) * 0.2
    return out


def _raw(t):
    t = t.detach().contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16).numpy().tobytes()  # little-endian, as safetensors stores
    return t.numpy().astype("<f4").tobytes()


def write_safetensors(path, tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        raw = _raw(t)
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def write_dir(d, tensors, config, dtype, shards):
    """Writes d/config.json and the tensors (cast to dtype) in `shards` files."""
    os.makedirs(d, exist_ok=True)
    config = dict(config, torch_dtype=TORCH_DTYPE[dtype])
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    names = list(tensors)
    per = -(-len(names) // shards)
    weight_map, total = {}, 0
    for k in range(shards):
        part = {n: tensors[n].to(dtype) for n in names[k * per:(k + 1) * per]}
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(os.path.join(d, file), part, {"format": "pt"})
        for n, t in part.items():
            weight_map[n] = file
            total += t.numel() * t.element_size()
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


# ({name: tensor}, metadata) of one safetensors file: torch_gpt's reader.
read_safetensors = torch_gpt.load_safetensors


def read_dir(d):
    """({name: tensor as stored}, config) of a directory, as from_pretrained reads it."""
    with open(os.path.join(d, "config.json")) as f:
        config = json.load(f)
    single = os.path.join(d, "model.safetensors")
    if os.path.exists(single):
        return read_safetensors(single)[0], config
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    tensors = {}
    for file in sorted(set(weight_map.values())):
        part, _ = read_safetensors(os.path.join(d, file))
        tensors.update({n: t for n, t in part.items() if weight_map.get(n) == file})
    missing = set(weight_map) - set(tensors)
    assert not missing, f"{d}: the index names tensors its shards lack: {sorted(missing)}"
    return tensors, config


def model(tensors, config, dtype=torch.float32):
    """torch_llama.Llama of a config.json's fields (fp32 weights upcast to dtype)."""
    return torch_llama.Llama({n: t.float() for n, t in tensors.items()},
                             layers_=config["num_hidden_layers"],
                             heads=config["num_attention_heads"],
                             kv_heads=config.get("num_key_value_heads",
                                                 config["num_attention_heads"]),
                             theta=config.get("rope_theta", 10000.0),
                             eps=config.get("rms_norm_eps", 1e-6),
                             scaling=config.get("rope_scaling"), dtype=dtype)
