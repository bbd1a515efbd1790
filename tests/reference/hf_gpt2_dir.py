"""A Hugging Face GPT-2 directory read as GPT2LMHeadModel.from_pretrained and
GPT2Tokenizer read it, in plain Python (torch 1.13, no transformers):
config.json's n_layer/n_embd/n_head/vocab_size/n_positions, model.safetensors
under HF's names (with or without the "transformer." prefix), and the
tokenizer's vocab.json + merges.txt. What fsc-train --save-dir is checked
against (tests/tools/train_e2e_user.py, mode save-dir)."""
import json
import os

import torch

import torch_gpt

REQUIRED = ("config.json", "model.safetensors")


def read(d, dtype=torch.float32):
    """The directory's model as a torch_gpt.GPT in dtype, and its config."""
    for f in REQUIRED:
        if not os.path.exists(os.path.join(d, f)):
            raise FileNotFoundError(f"{d} has no {f}: from_pretrained would refuse it")
    config = json.load(open(os.path.join(d, "config.json")))
    if config.get("model_type") != "gpt2" or "GPT2LMHeadModel" not in config.get(
            "architectures", []):
        raise ValueError(f"{d}/config.json is not a GPT-2 causal LM: {config}")
    tensors, _ = torch_gpt.load_safetensors(os.path.join(d, "model.safetensors"))
    model = torch_gpt.GPT(config["vocab_size"], config["n_positions"], config["n_layer"],
                          config["n_embd"], config["n_head"])
    model.load(tensors)
    return model.to(dtype), config


def tokenizer_files(d):
    """vocab.json as a dict and merges.txt's merge pairs, as GPT2Tokenizer reads them."""
    vocab = json.load(open(os.path.join(d, "vocab.json"), encoding="utf-8"))
    with open(os.path.join(d, "merges.txt"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    merges = [tuple(l.split()) for l in lines[1:] if l.strip()]  # line 0: "#version: ..."
    return vocab, merges
