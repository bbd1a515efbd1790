"""Saves outside the checkpoint directory commit only after every rank reported
success (issue 29): a write failing on one rank only, injected below fsc by the
shim tests/tools/io_fault_shim.c, must end every rank with a non-zero exit, the
message naming the failing rank and the file, nothing committed and the files
already there unchanged. Cases: --save-adapter on 2 ranks (rank 0 writes the
PEFT directory) and --save under --tp 2 (each TP rank writes its slices).
Before the fix, --save-adapter's rank 1 never learnt of rank 0's failure and
exited 0."""
import os
import shutil
import subprocess
import sys

from train_e2e_common import FSC_TRAIN, TINY, TMP, fsc_line, mpiexec
from train_e2e_io import require_shim, shim_env


def each_rank(n, *args, env):
    """Runs fsc-train on n ranks, each under a shell that reports its own exit
    status ("rank R exit S" on stderr): mpiexec's status is only the first
    failure's, and the launcher ends the other ranks when the first one's
    process ends, so each shell outlives its fsc-train by a few seconds (a
    failing fsc-train that is not the reporter waits 2 s before it exits)."""
    launcher = os.environ.get("FSC_MPIEXEC", "mpiexec")
    script = ('"$@"; s=$?; echo "rank ${OMPI_COMM_WORLD_RANK:-$PMI_RANK} exit $s" >&2; '
              'sleep 6')
    cmd = [launcher, "-n", str(n), "--oversubscribe", "sh", "-c", script, "sh", FSC_TRAIN,
           *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env,
                       start_new_session=True)
    codes = {}
    for line in p.stderr.splitlines():
        w = line.split()
        if len(w) == 4 and w[0] == "rank" and w[2] == "exit":
            codes[int(w[1])] = int(w[3])
    return p, codes


def snapshot(paths):
    return {x: open(x, "rb").read() for x in paths}


def expect_failed(what, p, codes, n, needles, before, folder, prefix):
    """Every rank of the finished run failed, the messages name every needle,
    the files of before are unchanged and nothing starting with prefix was left
    in folder beside them."""
    if sorted(codes) != list(range(n)) or any(c == 0 for c in codes.values()):
        sys.exit(f"FAIL: {what}: the ranks' exits are {codes}; every rank must fail:\n{p.stderr}")
    for needle in needles:
        if needle not in p.stderr:
            sys.exit(f"FAIL: {what}: {needle!r} not in the messages:\n{p.stderr}")
    for path, data in before.items():
        if open(path, "rb").read() != data:
            sys.exit(f"FAIL: {what}: {path} was changed")
    stray = sorted(x for x in os.listdir(folder)
                   if x.startswith(prefix) and os.path.join(folder, x) not in before)
    if stray:
        sys.exit(f"FAIL: {what}: left in {folder}: {stray}")
    print(f"ok  {what}: exits {codes}; {fsc_line(p)[:160]}")


def save_agree():
    require_shim()
    os.makedirs(TMP, exist_ok=True)
    # --save-adapter: rank 0 writes the directory; its writes fail
    lora = [*TINY, "--quiet", "--strategy", "ddp", "--lora-rank", "4", "--lora-targets", "c_attn"]
    ad = os.path.join(TMP, "agree-adapter")
    shutil.rmtree(ad, ignore_errors=True)
    mpiexec(2, *lora, "--steps", "1", "--save-adapter", ad)
    files = [os.path.join(ad, x) for x in ("adapter_model.safetensors", "adapter_config.json")]
    before = snapshot(files)
    p, codes = each_rank(2, *lora, "--steps", "2", "--save-adapter", ad,
                         env=shim_env(path="agree-adapter/adapter_model", rank=0, write="EIO",
                                      fsync="EIO"))
    expect_failed("--save-adapter, rank 0's writes EIO", p, codes, 2,
                  ["rank 0", "adapter_model.safetensors", "Input/output error"], before, ad, "")
    # --save under --tp 2: rank 1's slices fail to land in the file
    out = os.path.join(TMP, "agree-tp.safetensors")
    with open(out, "wb") as f:
        f.write(b"the previous weights")
    before = snapshot([out])
    p, codes = each_rank(2, *TINY, "--quiet", "--strategy", "ddp", "--tp", "2", "--steps", "1",
                         "--save", out, env=shim_env(path="agree-tp.safetensors", rank=1,
                                                     write="EIO"))
    expect_failed("--tp 2 --save, rank 1's writes EIO", p, codes, 2,
                  ["rank 1", "agree-tp.safetensors"], before, TMP,
                  "agree-tp.safetensors")
    shutil.rmtree(ad, ignore_errors=True)
    os.unlink(out)
