"""Hugging Face LLaMA directories both ways, against the PyTorch LLaMA of
tests/reference (torch_llama.py, hf_llama_dir.py). Usage: hf_llama_e2e.py
FSC_TRAIN FSC_SAMPLE.

(a) PyTorch writes a directory (config.json + two safetensors shards with
    model.safetensors.index.json), once in float32 and once in bfloat16 (with
    Qwen-style q/k/v biases, tied embeddings and LLaMA-3.1's rope_scaling);
    fsc-sample --logits gives its logits within the noise floor.
(b) fsc-train --save-init DIR (sharded by --shard-size) loads in PyTorch with
    fsc's logits, and --init-from DIR trains from it; ddp, fsdp and --pp 2 on
    2 ranks write the very same files; with --save-dtype bf16 every tensor is
    torch's bf16 rounding of the float32 one and fsc reads it back.
(c) Bad directories are refused naming what is wrong.
(d) fsc-sample draws the same ids with and without the KV cache.

The noise floor: the reference forward in float64 on the very weights the
file holds (bf16 values are exact in float32, so both files are exact
weights after loading) is the truth; PyTorch's own float32 forward misses it
by its accumulated rounding, e32 (max over the logits). fsc's float32
forward sums in other orders (its GEMMs, its attention) and may miss it by
rounding of the same size, not by any error of the model: allowed
max(FLOOR_K * e32, 2 ulps of the largest logit). A wrong weight, layout,
rotary frequency or eps misses by orders of magnitude more."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))

FLOOR_K = 8  # float32 orders of summation differ by a small multiple of one order's error
TMP = tempfile.mkdtemp(prefix="fsc-hf-")
LLAMA = ["--arch", "llama", "--layers", 2, "--d-model", 64, "--heads", 4, "--kv-heads", 2,
         "--seq", 32, "--vocab", 512, "--qkv-bias", 1, "--rope-theta", 50000]
PROMPT = [3, 17, 200, 41, 5, 99, 250, 7, 64, 128, 1, 33, 300, 12, 8, 77]


def tool(path, *args, expect_ok=True):
    p = subprocess.run([path, *map(str, args)], capture_output=True, text=True, timeout=600)
    if p.returncode < 0 or (expect_ok and p.returncode != 0):
        sys.exit(f"FAIL: {os.path.basename(path)} {' '.join(map(str, args))} exited "
                 f"{p.returncode}:\n{p.stderr}")
    return p


def refused(p, needle, what):
    if p.returncode == 0 or needle not in p.stderr:
        sys.exit(f"FAIL: {what}: expected a refusal naming '{needle}', got exit {p.returncode}:\n"
                 f"{p.stderr}")
    print(f"ok  {what}: {p.stderr.strip().splitlines()[-1]}")


def fsc_logits(sample, d, hd):
    out = os.path.join(TMP, "logits.safetensors")
    tool(sample, "--model", d, "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", 0,
         "--logits", out, "--quiet")
    return hd.read_safetensors(out)[0]["logits"].double()


def compare(what, torch, hd, tensors, config, got):
    x = torch.tensor([PROMPT])
    with torch.no_grad():
        ref64 = hd.model(tensors, config, torch.float64).logits(x)[0]
        ref32 = hd.model(tensors, config, torch.float32).logits(x)[0].double()
    e32 = (ref32 - ref64).abs().max().item()
    ulp = 2 * 2.0 ** -23 * ref64.abs().max().item()
    err = (got - ref64).abs().max().item()
    bound = max(FLOOR_K * e32, ulp)
    print(f"{what}: fsc's logits miss the float64 reference by {err:.2e}; PyTorch float32 by "
          f"{e32:.2e} (bound {bound:.2e})")
    if got.shape != ref64.shape or not err <= bound:
        sys.exit(f"FAIL: {what}: fsc's logits differ from PyTorch's by {err:.2e} > {bound:.2e}")


def config_of(V, C, L, NH, NKV, F, **extra):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V,
         "hidden_size": C, "intermediate_size": F, "num_hidden_layers": L,
         "num_attention_heads": NH, "num_key_value_heads": NKV, "max_position_embeddings": 64,
         "hidden_act": "silu", "rope_theta": 10000.0, "rope_scaling": None,
         "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False}
    c.update(extra)
    return c


def torch_writes(torch, hd, sample):
    """(a): PyTorch's directories load in fsc with PyTorch's logits."""
    cases = (
        ("float32 shards", torch.float32, False, False, {}),
        ("bfloat16 shards, q/k/v biases, tied, llama3 rope_scaling", torch.bfloat16, True, True,
         {"rope_theta": 500000.0, "rms_norm_eps": 1e-6, "attention_bias": True,
          "tie_word_embeddings": True,
          "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}),
    )
    for what, dtype, bias, tied, extra in cases:
        d = os.path.join(TMP, what.split()[0])
        tensors = hd.random_llama(512, 64, 2, 4, 2, 160, bias, tied, seed=len(what))
        config = config_of(512, 64, 2, 4, 2, 160, **extra)
        hd.write_dir(d, tensors, config, dtype, shards=2)
        stored, _ = hd.read_dir(d)  # the weights as the file holds them (bf16: rounded)
        compare("(a) PyTorch's " + what, torch, hd, stored, config, fsc_logits(sample, d, hd))
    return os.path.join(TMP, "bfloat16")


def fsc_writes(torch, hd, train, sample):
    """(b): fsc-train's directory loads in PyTorch with fsc's logits."""
    d = os.path.join(TMP, "fsc_dir")
    tool(train, *LLAMA, "--steps", 0, "--save-init", d, "--shard-size", "100KB", "--quiet")
    shards = [f for f in os.listdir(d) if f.startswith("model-")]
    if len(shards) < 2 or not os.path.exists(os.path.join(d, "model.safetensors.index.json")):
        sys.exit(f"FAIL: --save-init DIR --shard-size 100KB wrote {sorted(os.listdir(d))}")
    tensors, config = hd.read_dir(d)
    if config.get("torch_dtype") != "float32" or config["model_type"] != "llama":
        sys.exit(f"FAIL: fsc's config.json: {config}")
    print(f"ok  (b) fsc-train --save-init DIR: config.json and {len(shards)} shards with an index")
    compare("(b) fsc's directory in PyTorch", torch, hd, tensors, config,
            fsc_logits(sample, d, hd))
    return d


def fsc_writes_bf16(torch, hd, train, sample, d):
    """(b) in bf16: --save-dtype bf16 writes every tensor as torch's .to(torch.bfloat16) of the
    float32 directory's, bit for bit, config.json says torch_dtype bfloat16, and fsc reads it
    back with PyTorch's logits on those weights."""
    b = os.path.join(TMP, "fsc_dir_bf16")
    tool(train, *LLAMA, "--steps", 0, "--save-init", b, "--shard-size", "50KB", "--save-dtype",
         "bf16", "--quiet")
    got, config = hd.read_dir(b)
    want, _ = hd.read_dir(d)
    wrong = [n for n in want if n not in got or got[n].dtype != torch.bfloat16 or
             not torch.equal(got[n].view(torch.int16), want[n].to(torch.bfloat16).view(torch.int16))]
    if wrong or set(got) != set(want) or config.get("torch_dtype") != "bfloat16":
        sys.exit(f"FAIL: --save-dtype bf16: tensors not torch's bf16 rounding {wrong}, "
                 f"torch_dtype {config.get('torch_dtype')}")
    print(f"ok  (b) --save-dtype bf16: {len(got)} tensors, torch's round-to-nearest-even bit for "
          f"bit, torch_dtype bfloat16")
    compare("(b) fsc's bf16 directory in PyTorch", torch, hd, got, config,
            fsc_logits(sample, b, hd))


def same_files(train, d):
    """Every strategy's save path writes the same directory, byte for byte."""
    launcher = os.environ.get("FSC_MPIEXEC", "mpiexec")
    for what, extra in (("ddp", ["--strategy", "ddp"]), ("fsdp", ["--strategy", "fsdp"]),
                        ("--pp 2", ["--strategy", "ddp", "--pp", 2, "--grad-accum", 2])):
        other = os.path.join(TMP, "dir_" + what.replace(" ", "").replace("-", ""))
        cmd = [launcher, "-n", "2", "--oversubscribe", train, *map(str, LLAMA + extra),
               "--steps", "0", "--batch", "2", "--save-init", other, "--shard-size", "100KB",
               "--quiet"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                           start_new_session=True)
        if p.returncode != 0:
            sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}:\n{p.stderr}")
        names = sorted(os.listdir(d))
        if sorted(os.listdir(other)) != names or any(
                open(os.path.join(d, n), "rb").read() != open(os.path.join(other, n), "rb").read()
                for n in names):
            sys.exit(f"FAIL: --save-init DIR under {what} on 2 ranks differs from one process's")
    print(f"ok  ddp, fsdp and --pp 2 on 2 ranks write the very files of one process ({len(names)})")


def refusals(train, d):
    """(c): bad directories and contradicting flags, named."""
    base = ["--steps", 1, "--batch", 2, "--quiet"]
    p = tool(train, "--init-from", d, "--heads", 8, *base, expect_ok=False)
    refused(p, "--heads 8 contradicts", "a flag contradicting config.json")
    p = tool(train, "--init-from", d, "--arch", "gpt2", *base, expect_ok=False)
    refused(p, "--arch gpt2 contradicts", "--arch gpt2 on a LLaMA directory")
    bad = os.path.join(TMP, "bad")

    def fresh():
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(d, bad)
        return json.load(open(os.path.join(bad, "model.safetensors.index.json")))

    index = fresh()
    last = sorted(set(index["weight_map"].values()))[-1]
    os.remove(os.path.join(bad, last))
    refused(tool(train, "--init-from", bad, *base, expect_ok=False), f"shard {last}",
            "a missing shard")
    index = fresh()
    del index["weight_map"]["model.norm.weight"]
    json.dump(index, open(os.path.join(bad, "model.safetensors.index.json"), "w"))
    refused(tool(train, "--init-from", bad, *base, expect_ok=False), "model.norm.weight",
            "a tensor missing from weight_map")
    fresh()
    c = json.load(open(os.path.join(bad, "config.json")))
    json.dump(dict(c, intermediate_size=128), open(os.path.join(bad, "config.json"), "w"))
    refused(tool(train, "--init-from", bad, *base, expect_ok=False), "gate_proj.weight has shape",
            "a tensor of another shape than config.json says")
    json.dump(dict(c, model_type="mamba"), open(os.path.join(bad, "config.json"), "w"))
    refused(tool(train, "--init-from", bad, *base, expect_ok=False), "\"model_type\" \"mamba\"",
            "an unknown model_type")
    json.dump(dict(c, num_key_value_heads=3), open(os.path.join(bad, "config.json"), "w"))
    refused(tool(train, "--init-from", bad, *base, expect_ok=False), "num_key_value_heads",
            "an impossible num_key_value_heads")


def main():
    train, sample = sys.argv[1], sys.argv[2]
    try:
        import torch
        import hf_llama_dir as hd
    except ImportError:
        print("SKIP: PyTorch is not installed (scripts/install-deps.sh installs python3-torch)")
        sys.exit(77)
    torch.set_num_threads(1)
    torch_dir = torch_writes(torch, hd, sample)
    d = fsc_writes(torch, hd, train, sample)
    fsc_writes_bf16(torch, hd, train, sample, d)
    same_files(train, d)
    metrics = os.path.join(TMP, "m.jsonl")  # --init-from DIR trains (model flags from config.json)
    tool(train, "--init-from", d, "--steps", 2, "--batch", 2, "--quiet", "--metrics", metrics)
    if len(open(metrics).readlines()) != 2:
        sys.exit("FAIL: --init-from DIR did not train 2 steps")
    print("ok  fsc-train --init-from DIR trains with config.json's model")
    refusals(train, d)
    ids = ",".join(map(str, PROMPT[:5]))
    for model in (torch_dir, d):  # (d): the KV cache (KV heads only, RoPE offsets) = full forward
        a = tool(sample, "--model", model, "--prompt-ids", ids, "--max-new-tokens", 24, "--ids",
                 "--seed", 5, "--quiet").stdout.split()
        b = tool(sample, "--model", model, "--prompt-ids", ids, "--max-new-tokens", 24, "--ids",
                 "--seed", 5, "--quiet", "--no-kv-cache").stdout.split()
        if a != b or len(a) != 24:
            sys.exit(f"FAIL: fsc-sample {model}: KV cache {a} vs full forward {b}")
    print("ok  (d) fsc-sample: the same 24 ids with and without the KV cache, both directories")
    shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    main()
