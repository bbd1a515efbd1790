#!/usr/bin/env python3
"""peer_bench.py: the PyTorch (and, where installed, FairScale) side of fsc's
benchmark comparisons.

It trains the GPT (or, with --arch llama, the LLaMA of scripts/peer_llama.py)
of fsc-bench's reference configurations on uniformly random tokens with AdamW (lr 3e-4, betas 0.9/0.95, weight decay 0.1, no clipping, a
constant rate) and prints one JSON line shaped like fsc-bench's: tokens/s over
the timed steps that follow the warm-up steps, the median ms per step, model
GFLOP/s by the same FLOP count, peak RSS per rank, first and last loss. One
thread per process unless --threads says otherwise, as fsc-bench.

  config   layers d_model heads seq vocab batch    (fsc-bench --config)
  small         4     256     4  128   512     8
  medium        8     512     8  256  8192     4
  tiny          2      32     2   16    64     2    (this script's own test)

--arch llama (fsc-bench --arch llama) takes the same sizes with grouped-query
attention over --kv-heads key/value heads (small and medium 2, tiny 1), a
SwiGLU MLP of --ffn-hidden (default LLaMA's rule, fsc's: 2/3 of 4 C rounded
up to 256; small 768, medium 1536), RMSNorm, rotary positions and an untied
head.

Strategies (--strategy):
  single          one process, no torch.distributed
  ddp             torch DistributedDataParallel over gloo on 127.0.0.1
  zero1           torch ZeroRedundancyOptimizer (AdamW) + DDP
  fairscale-oss   FairScale OSS (AdamW) + torch DDP                (needs FairScale)
  fairscale-sdp   FairScale OSS + ShardedDataParallel (ZeRO-2)     (needs FairScale)
  fairscale-fsdp  FairScale FullyShardedDataParallel, every block
                  and the root a unit, with CPU stand-ins for the
                  CUDA streams and gloo's missing reduce_scatter   (needs FairScale)
  fairscale-pipe  FairScale Pipe in one process, --ranks CPU
                  partitions, --chunks micro-batches of --batch    (needs FairScale)

FairScale is used only when `import fairscale` works in the interpreter that
runs this script (a pip install, or PYTHONPATH naming a checkout of FairScale
0.4.13, which runs with torch 1.13); Debian packages no FairScale, so on a
machine set up by scripts/install-deps.sh the fairscale-* rows are skipped:
the script says why on stderr and exits 77. It exits 77 as well when torch
cannot be imported (Debian's python3-torch is 1.13; run /usr/bin/python3 when
another python3 comes first on PATH).

Ranks: --ranks N starts N local processes itself; under torchrun (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or mpirun (OMPI_COMM_WORLD_* or PMI_*;
rendezvous on 127.0.0.1:--port) it is one of the ranks and --ranks is ignored.
Throughput counts every rank's sequences; a step's time is the slowest rank's.

Examples:
  /usr/bin/python3 scripts/peer_bench.py --config small
  /usr/bin/python3 scripts/peer_bench.py --config medium --autocast bf16 --steps 6 --warmup 2
  /usr/bin/python3 scripts/peer_bench.py --arch llama --config medium [--autocast bf16]
  /usr/bin/python3 scripts/peer_bench.py --config medium --strategy ddp --ranks 2
  mpirun -n 2 /usr/bin/python3 scripts/peer_bench.py --config medium --strategy zero1
"""
import argparse
import json
import os
import sys

CONFIGS = {  # name: (layers, d_model, heads, seq, vocab, batch), as tools/fsc_bench.c
    "small": (4, 256, 4, 128, 512, 8),
    "medium": (8, 512, 8, 256, 8192, 4),
    "tiny": (2, 32, 2, 16, 64, 2),
}
LLAMA_KV_HEADS = {"small": 2, "medium": 2, "tiny": 1}  # as tools/fsc_bench.c's LLAMA_CONFIGS
TORCH_ONLY = ("single", "ddp", "zero1")
NEEDS_FAIRSCALE = ("fairscale-oss", "fairscale-sdp", "fairscale-fsdp", "fairscale-pipe")
SKIPPED = 77  # the exit status ctest reads as "skipped"


def options(argv):
    p = argparse.ArgumentParser(prog="peer_bench.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", choices=sorted(CONFIGS), default="small",
                   help="the model and per-rank batch (default small); the flags below override one field")
    for flag in ("layers", "d-model", "heads", "seq", "vocab", "batch"):
        p.add_argument("--" + flag, type=int, default=None)
    p.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2",
                   help="the model family (default gpt2), as fsc-bench --arch")
    p.add_argument("--kv-heads", type=int, default=None,
                   help="llama: key/value heads, dividing --heads (default: the config's)")
    p.add_argument("--ffn-hidden", type=int, default=None,
                   help="llama: SwiGLU width (default LLaMA's rule from --d-model)")
    p.add_argument("--strategy", choices=TORCH_ONLY + NEEDS_FAIRSCALE, default="single")
    p.add_argument("--ranks", type=int, default=2,
                   help="processes this script starts for a distributed strategy, or the pipeline's "
                        "partitions (default 2; ignored under torchrun or mpirun)")
    p.add_argument("--steps", type=int, default=10, help="timed steps (default 10, as fsc-bench)")
    p.add_argument("--warmup", "--warmup-steps", type=int, default=3, dest="warmup",
                   help="untimed steps first (default 3, as fsc-bench)")
    p.add_argument("--threads", type=int, default=1, help="intra-op, OpenMP and BLAS threads per process")
    p.add_argument("--autocast", choices=("none", "bf16"), default="none",
                   help="bf16: forward under torch.autocast on the CPU (bf16 matmuls through oneDNN, fp32 "
                        "weights and optimizer): the peer of fsc-bench --mixed-precision bf16")
    p.add_argument("--chunks", type=int, default=8, help="fairscale-pipe: micro-batches per step (default 8)")
    p.add_argument("--balance", default=None,
                   help="fairscale-pipe: layers per partition, e.g. 6,4 (the embedding and the head count "
                        "as one layer each); default: blocks split evenly")
    p.add_argument("--pipe-checkpoint", choices=("always", "except_last", "never"), default="except_last",
                   help="fairscale-pipe: which micro-batches recompute their forward in backward "
                        "(default except_last, FairScale's own default)")
    p.add_argument("--openblas-coretype", default="auto",
                   help="OPENBLAS_CORETYPE for torch's OpenBLAS: auto (default) keeps the environment's, "
                        "else picks as fsc does from the CPU's flags (avx512f: SkylakeX, avx2: Haswell); "
                        "unset removes it (OpenBLAS then detects the CPU itself); any other value is "
                        "exported as given")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--port", type=int, default=29517,
                   help="rendezvous port on 127.0.0.1 under mpirun (default 29517)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before started ranks are stopped")
    a = p.parse_args(argv)
    shape = dict(zip(("layers", "d_model", "heads", "seq", "vocab", "batch"), CONFIGS[a.config]))
    for k in shape:
        if getattr(a, k) is None:
            setattr(a, k, shape[k])
    a.custom = any(getattr(a, k) != v for k, v in shape.items())
    if a.arch == "llama":
        a.custom |= a.kv_heads not in (None, LLAMA_KV_HEADS[a.config]) or a.ffn_hidden is not None
        if a.kv_heads is None:
            a.kv_heads = min(LLAMA_KV_HEADS[a.config], a.heads)
        if a.ffn_hidden is None:
            a.ffn_hidden = (2 * 4 * a.d_model // 3 + 255) // 256 * 256
        if a.kv_heads < 1 or a.heads % a.kv_heads or a.ffn_hidden < 1 or (a.d_model // a.heads) % 2:
            p.error("--arch llama: --kv-heads must divide --heads, --ffn-hidden be >= 1 and the head "
                    "dimension (--d-model / --heads) even for rotary embeddings")
    elif a.kv_heads is not None or a.ffn_hidden is not None:
        p.error("--kv-heads and --ffn-hidden are LLaMA-family settings: add --arch llama")
    if min(a.layers, a.d_model, a.heads, a.seq, a.vocab, a.batch, a.steps, a.threads, a.ranks, a.chunks) < 1 \
            or a.warmup < 0:
        p.error("sizes, --steps, --threads, --ranks and --chunks must be >= 1, --warmup >= 0")
    if a.d_model % a.heads:
        p.error("--d-model must be a multiple of --heads")
    if a.strategy == "fairscale-pipe" and a.autocast != "none":
        p.error("--autocast with fairscale-pipe: Pipe runs its partitions on worker threads, "
                "which torch.autocast (a per-thread state) does not reach")
    return a


def launched_rank():
    """(rank, world) when a launcher started this process as one of several ranks."""
    for r, w in (("RANK", "WORLD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                 ("PMI_RANK", "PMI_SIZE")):
        if r in os.environ and w in os.environ:
            return int(os.environ[r]), int(os.environ[w])
    return None


def cpu_coretype():
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        return None
    return "SkylakeX" if "avx512f" in flags else "Haswell" if "avx2" in flags else None


def set_environment(a):
    """Threads and BLAS kernels are fixed when torch loads OpenMP and OpenBLAS,
    so this runs before the first `import torch`."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(a.threads)
    if a.openblas_coretype == "unset":
        os.environ.pop("OPENBLAS_CORETYPE", None)
    elif a.openblas_coretype == "auto":
        if not os.environ.get("OPENBLAS_CORETYPE") and cpu_coretype():
            os.environ["OPENBLAS_CORETYPE"] = cpu_coretype()
    else:
        os.environ["OPENBLAS_CORETYPE"] = a.openblas_coretype
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def skip(why):
    print(f"peer_bench.py: skipped: {why}", file=sys.stderr, flush=True)
    sys.exit(SKIPPED)


A = options(sys.argv[1:]) if __name__ == "__main__" else None
if A is not None:
    set_environment(A)
try:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    if A is None:
        raise
    skip(f"{sys.executable} cannot import torch ({e}); install python3-torch (Debian: PyTorch 1.13) "
         "or run /usr/bin/python3")
import math  # noqa: E402
import resource  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_llama  # noqa: E402


# ---- the model: GPT-2 as fsc builds it (pre-LN blocks, tanh GELU, head tied to wte) ----
class Attention(nn.Module):
    def __init__(self, C, NH, T):
        super().__init__()
        self.NH = NH
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        # a plain attribute, not a buffer: DDP would broadcast it, and gloo has no bool
        self.future = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)

    def forward(self, x):  # x is (B,T,C)
        B, T, C = x.shape
        heads = self.c_attn(x).view(B, T, 3, self.NH, C // self.NH).permute(2, 0, 3, 1, 4)
        q, k, v = heads[0], heads[1], heads[2]  # each (B,NH,T,hs)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(C // self.NH)
        probs = scores.masked_fill(self.future[:T, :T], float("-inf")).softmax(-1)
        return self.c_proj((probs @ v).transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, C, NH, T):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(C), Attention(C, NH, T), nn.LayerNorm(C)
        self.c_fc, self.c_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Embedding(nn.Module):
    def __init__(self, V, T, C):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)

    def forward(self, idx):  # idx is (B,T) token ids
        return self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))


class Head(nn.Module):
    """ln_f and the LM head; the head's weight is the embedding's wte."""

    def __init__(self, embedding, C):
        super().__init__()
        self.ln_f = nn.LayerNorm(C)
        self.tied = [embedding]  # a list: the embedding stays registered in one place only

    def forward(self, x):
        return F.linear(self.ln_f(x), self.tied[0].wte.weight)


class GPT(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embedding = Embedding(a.vocab, a.seq, a.d_model)
        self.blocks = nn.ModuleList(Block(a.d_model, a.heads, a.seq) for _ in range(a.layers))
        self.head = Head(self.embedding, a.d_model)
        for m in self.modules():  # GPT-2's initialisation
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)
        for b in self.blocks:  # the projections into the residual stream
            for w in (b.attn.c_proj.weight, b.c_proj.weight):
                nn.init.normal_(w, 0.0, 0.02 / math.sqrt(2 * a.layers))

    def layers(self):
        """The model as a list a pipeline cuts: embedding, blocks, head."""
        return [self.embedding, *self.blocks, self.head]

    def forward(self, idx, targets):
        x = self.embedding(idx)
        for b in self.blocks:
            x = b(x)
        logits = self.head(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def flops_per_token(a, params):
    """fsc_gpt_flops_per_token: 6 per weight but wpe's, plus attention's 12 L C T."""
    return 6 * (params - a.seq * a.d_model) + 12 * a.layers * a.d_model * a.seq


# ---- FairScale's FSDP on CPU and gloo ----
class _NoStream:
    """torch.cuda.Stream's surface for FSDP on the CPU, where work is already in order."""

    def wait_stream(self, *_):
        pass

    def wait_event(self, *_):
        pass

    def synchronize(self):
        pass

    def record_event(self, *_):
        return None


def fsdp_on_cpu():
    """FairScale 0.4.13's FSDP asks for CUDA streams and reduce_scatter, which
    the CPU and gloo lack; give it no-op streams and a reduce_scatter made of
    one reduce per shard. Returns what was replaced, for the JSON line."""
    import contextlib
    no_stream = _NoStream()
    torch.cuda.current_stream = lambda device=None: no_stream
    torch.cuda.stream = lambda stream=None: contextlib.nullcontext()
    torch.cuda.Stream = lambda *args, **kw: no_stream
    torch.Tensor.record_stream = lambda tensor, stream: None
    os.environ["ENABLE_NCCL_BASE_COLLECTIVES"] = "0"  # the list forms of all_gather / reduce_scatter

    def reduce_scatter(output, inputs, op=dist.ReduceOp.SUM, group=None, async_op=False):
        group = group or dist.group.WORLD
        me = dist.get_rank(group)
        for i, piece in enumerate(inputs):
            owner = dist.get_global_rank(group, i) if group is not dist.group.WORLD else i
            summed = piece.detach().clone()
            dist.reduce(summed, dst=owner, op=op, group=group)
            if i == me:
                output.copy_(summed.view_as(output))
        return None

    dist.reduce_scatter = reduce_scatter  # FairScale calls it through torch.distributed

    # The root makes its streams only when CUDA is there, and shares that dict
    # with every unit: fill it once it exists.
    from fairscale.nn.data_parallel import FullyShardedDataParallel as FSDP
    make_streams = FSDP._setup_streams

    def setup_streams(self):
        make_streams(self)
        for name in ("fp32_to_fp16", "all_gather", "post_backward"):
            self._streams.setdefault(name, no_stream)

    FSDP._setup_streams = setup_streams
    return ["torch.cuda streams: one no-op stream", "dist.reduce_scatter: one dist.reduce per shard",
            "ENABLE_NCCL_BASE_COLLECTIVES=0"]


def fairscale_version():
    try:
        import fairscale
    except ImportError as e:
        return None, str(e)
    return getattr(fairscale, "__version__", "unknown"), None


# ---- one rank's run ----
def wrap(a, model):
    """(what forward and zero_grad run on, the optimizer, notes)."""
    adamw = dict(lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    if a.strategy == "single":
        return model, torch.optim.AdamW(model.parameters(), **adamw), []
    from torch.nn.parallel import DistributedDataParallel as DDP
    if a.strategy == "ddp":
        net = DDP(model)
        return net, torch.optim.AdamW(net.parameters(), **adamw), []
    if a.strategy == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        net = DDP(model)
        return net, ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.AdamW, **adamw), []
    if a.strategy == "fairscale-oss":
        from fairscale.optim import OSS
        net = DDP(model)
        return net, OSS(net.parameters(), optim=torch.optim.AdamW, **adamw), []
    if a.strategy == "fairscale-sdp":
        from fairscale.nn.data_parallel import ShardedDataParallel
        from fairscale.optim import OSS
        opt = OSS(model.parameters(), optim=torch.optim.AdamW, **adamw)
        return ShardedDataParallel(model, opt), opt, []
    if a.strategy == "fairscale-fsdp":
        notes = fsdp_on_cpu()
        from fairscale.nn.data_parallel import FullyShardedDataParallel as FSDP
        unit = dict(compute_device=torch.device("cpu"), mixed_precision=False, flatten_parameters=True,
                    reshard_after_forward=True, move_params_to_cpu=False)
        model.blocks = nn.ModuleList(FSDP(b, **unit) for b in model.blocks)
        net = FSDP(model, **unit)
        return net, torch.optim.AdamW(net.parameters(), **adamw), notes
    raise AssertionError(a.strategy)


def pipeline(a, model):
    """fairscale-pipe: the model's layers cut into --ranks CPU partitions."""
    from fairscale.nn import Pipe
    layers = model.layers()
    if a.balance:
        balance = [int(x) for x in a.balance.split(",")]
    else:
        share, extra = divmod(a.layers, a.ranks)
        balance = [share + (i < extra) for i in range(a.ranks)]
        balance[0] += 1
        balance[-1] += 1
    if sum(balance) != len(layers) or min(balance) < 1:
        raise SystemExit(f"peer_bench.py: --balance {balance} does not cut {len(layers)} layers "
                         f"(embedding, {a.layers} blocks, head) into parts of at least one")
    net = Pipe(nn.Sequential(*layers), balance=balance, devices=["cpu"] * len(balance), chunks=a.chunks,
               checkpoint=a.pipe_checkpoint)
    how = f"Pipe balance {balance}, {a.chunks} micro-batches of {a.batch}, checkpoint {a.pipe_checkpoint}"
    return net, [how]


def batches(a, rank, count, rows):
    g = torch.Generator().manual_seed(a.seed * 7919 + rank)
    for _ in range(count):
        t = torch.randint(0, a.vocab, (rows, a.seq + 1), generator=g)
        yield t[:, :-1], t[:, 1:]


def run(rank, world, a):
    """Trains; returns this rank's record (rank 0 adds the JSON line's fields)."""
    torch.set_num_threads(a.threads)
    distributed = a.strategy not in ("single", "fairscale-pipe")
    torch.manual_seed(a.seed)  # the same initial weights on every rank
    model = peer_llama.Llama(a) if a.arch == "llama" else GPT(a)
    params = sum(p.numel() for p in model.parameters())
    flops = peer_llama.flops_per_token(a, params) if a.arch == "llama" else flops_per_token(a, params)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16")
    if a.strategy == "fairscale-pipe":
        net, notes = pipeline(a, model)
        opt = torch.optim.AdamW(net.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
        rows = a.batch * a.chunks

        def forward(x, y):
            logits = net(x)
            return F.cross_entropy(logits.reshape(-1, a.vocab), y.reshape(-1))
    else:
        net, opt, notes = wrap(a, model)
        rows = a.batch

        def forward(x, y):
            return net(x, y)
    seconds, losses, cpu = [], [], 0.0
    for s, (x, y) in enumerate(batches(a, rank, a.warmup + a.steps, rows)):
        if s == a.warmup and distributed:
            dist.barrier()  # every rank starts the timed steps together
        t0, c0 = time.perf_counter(), time.process_time()
        net.zero_grad(set_to_none=True)  # the module's own: ShardedDDP keeps its buckets there
        with autocast:
            loss = forward(x, y)
        loss.backward()
        opt.step()
        loss = float(loss)
        if s >= a.warmup:
            seconds.append(time.perf_counter() - t0)
            cpu += time.process_time() - c0
        losses.append(loss)
    mine = {"seconds": seconds, "losses": losses, "cpu": cpu,
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    everyone = [None] * world
    if distributed:
        dist.all_gather_object(everyone, mine)
    else:
        everyone = [mine]
    if rank != 0:
        return None
    step_s = [max(r["seconds"][i] for r in everyone) for i in range(a.steps)]
    tokens = a.steps * rows * a.seq * (world if distributed else 1)
    tok_s = tokens / sum(step_s)
    first = sum(r["losses"][0] for r in everyone) / len(everyone)
    last = sum(r["losses"][-1] for r in everyone) / len(everyone)
    version, _ = fairscale_version() if a.strategy in NEEDS_FAIRSCALE else (None, None)
    # one thread in one process: tokens per second of its CPU time, as fsc-bench's
    alone = {"cpu_tokens_per_s": round(tokens / mine["cpu"], 1)} \
        if a.strategy == "single" and a.threads == 1 and mine["cpu"] > 0 else {}
    return {
        "config": "custom" if a.custom else a.config, "arch": a.arch, "strategy": a.strategy,
        "ranks": world, "threads": a.threads, "layers": a.layers, "d_model": a.d_model,
        "heads": a.heads, **({"kv_heads": a.kv_heads, "ffn_hidden": a.ffn_hidden} if a.arch == "llama" else {}),
        "seq": a.seq, "vocab": a.vocab, "batch_per_worker": a.batch,
        "params": params, "steps": a.steps, "warmup": a.warmup, "autocast": a.autocast,
        "tokens_per_s": round(tok_s, 1), **alone,
        "ms_per_step_median": round(1e3 * sorted(step_s)[a.steps // 2], 2),
        "model_gflops": round(tok_s * flops / 1e9, 1),
        "first_loss": round(first, 4), "last_loss": round(last, 4),
        "peak_rss_mib_by_rank": [round(r["rss_mib"], 1) for r in everyone],
        "torch": torch.__version__, "fairscale": version,
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"), "openblas_kernels": openblas_kernels(),
        "notes": notes,
    }


def openblas_kernels():
    """The kernel set torch's OpenBLAS reports it runs (fsc-bench --blas-info's corename)."""
    try:
        import ctypes
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        return None


def rank_main(rank, world, a, init):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    line = run(rank, world, a)
    if line:
        print(json.dumps(line), flush=True)
    dist.barrier()
    # Leave without gloo's teardown: with torch 1.13 it has been seen to abort
    # or spin after all work was done, which would turn a finished run into a
    # failed or hung one.
    sys.stderr.flush()
    os._exit(0)


def spawned(rank, world, a, port):
    rank_main(rank, world, a, f"tcp://127.0.0.1:{port}")


def main(a):
    if a.strategy in NEEDS_FAIRSCALE:
        version, why = fairscale_version()
        if version is None:
            skip(f"--strategy {a.strategy} needs FairScale, which {sys.executable} cannot import ({why}); "
                 "pip install fairscale==0.4.13, or put a checkout of it on PYTHONPATH")
    if a.strategy in ("single", "fairscale-pipe"):
        line = run(0, a.ranks if a.strategy == "fairscale-pipe" else 1, a)
        print(json.dumps(line), flush=True)
        os._exit(0)  # Pipe's worker threads would hold the interpreter's exit
    launched = launched_rank()
    if launched:
        rank, world = launched
        if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
            rank_main(rank, world, a, "env://")
        rank_main(rank, world, a, f"tcp://127.0.0.1:{a.port}")
    with socket.socket() as s:  # a free port for the ranks started here
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import torch.multiprocessing as mp
    ranks = mp.start_processes(spawned, args=(a.ranks, a, port), nprocs=a.ranks, join=False,
                               start_method="spawn")
    deadline, failure = time.time() + a.timeout, None
    try:
        while not ranks.join(timeout=1):
            if time.time() > deadline:
                failure = f"the ranks did not finish within --timeout {a.timeout:g} s"
                break
    except Exception as e:  # a rank failed; torch has stopped the others
        failure = str(e).strip()
    for p in ranks.processes:
        if p.is_alive():
            p.kill()
            p.join()
    if failure:
        print(f"peer_bench.py: {failure}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main(A)
