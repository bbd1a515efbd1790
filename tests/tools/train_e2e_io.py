"""Disk faults where they really happen, below fsc and below MPI: the shim
tests/tools/io_fault_shim.c (FSC_IO_SHIM, preloaded into every rank) makes one
rank's writes into one checkpoint fail with EIO or ENOSPC, land as zeros while
reporting success, or makes its fsyncs fail. Every save path and layout must
then exit non-zero naming the rank and the file, keep `latest` on the previous
checkpoint with every member as its state.json records (also under
--keep-last 1, which must not prune it), and leave no trace of the torn save;
a final --save that fails leaves the file already at that path as it was; and
a disk slower than FSC_TIMEOUT_S per call still commits.
Before the fix Open MPI's MPI-IO reported the failed writes as successes and
fsc-train committed the torn checkpoint, exit 0."""
import os
import shutil
import sys

from train_e2e_common import TINY, TMP, fsc_line, mpiexec, verify_checkpoint

SHIM = os.environ.get("FSC_IO_SHIM")


def require_shim():
    """Skips the run (exit 77, ctest's SKIP_RETURN_CODE) when FSC_IO_SHIM names
    no shim library."""
    if not SHIM or not os.path.exists(SHIM):
        print("SKIP: FSC_IO_SHIM (the fault shim library) not given")
        sys.exit(77)


def shim_env(**fault):
    env = dict(os.environ)
    env["LD_PRELOAD"] = SHIM
    # a sanitizer build's runtime must come first in the list; the preloaded shim is
    # a plain library, so the check is turned off (every other ASan check stays)
    env["ASAN_OPTIONS"] = ":".join(
        x for x in (env.get("ASAN_OPTIONS"), "verify_asan_link_order=0") if x)
    for k, v in fault.items():
        env[f"FSC_SHIM_{k.upper()}"] = str(v)
    return env


def expect_failed_save(what, p, needles, ck, keep_step=2):
    """p (a finished run) failed naming every needle; ck's latest is still keep_step,
    intact, and no later step directory or temporary was left."""
    if p.returncode == 0:
        sys.exit(f"FAIL: {what}: exited 0 after a failed write:\n{p.stderr}")
    for n in needles:
        if n not in p.stderr:
            sys.exit(f"FAIL: {what}: {n!r} not in the message:\n{p.stderr}")
    step = verify_checkpoint(ck)
    if step != keep_step:
        sys.exit(f"FAIL: {what}: latest is step {step}, expected {keep_step}")
    left = sorted(x for x in os.listdir(ck) if x not in ("latest", f"step-{keep_step:06d}"))
    if left:
        sys.exit(f"FAIL: {what}: left in {ck}: {left}")
    print(f"ok  {what}: {fsc_line(p)[:200]}")


def io_faults():
    require_shim()
    base = [*TINY, "--quiet", "--steps", "6", "--save-every", "2"]
    # the MPI-IO path: rank 1's writes into step 4's files fail from byte 300,000
    # on (both files are ~470 KB and ~950 KB, split between the two ranks)
    mpiio = [("ddp", "EIO", 0), ("ddp", "ENOSPC", 1), ("fsdp", "EIO", 1), ("fsdp", "ENOSPC", 0),
             ("oss", "ENOSPC", 1), ("oss", "EIO", 0)]
    for strategy, err, keep in mpiio:
        ck = os.path.join(TMP, f"io-{strategy}-{err}-{keep}")
        p = mpiexec(2, *base, "--strategy", strategy, "--checkpoint-dir", ck, "--keep-last", keep,
                    expect_ok=False, env=shim_env(path=".step-000004.tmp", rank=1, write=err,
                                                  **{"from": 300000}))
        expect_failed_save(f"{strategy} MPI-IO, rank 1 {err}, keep-last {keep}", p,
                           ["rank 1", ".safetensors", "wrote 0 of"], ck)
    # writes that report success but land as zeros: only the CRC of the bytes
    # written against the bytes read back can tell
    for strategy in ("ddp", "fsdp"):
        ck = os.path.join(TMP, f"io-{strategy}-garble")
        p = mpiexec(2, *base, "--strategy", strategy, "--checkpoint-dir", ck, "--keep-last", 1,
                    expect_ok=False, env=shim_env(path=".step-000004.tmp", rank=1,
                                                  write="GARBLE", **{"from": 300000}))
        expect_failed_save(f"{strategy} MPI-IO, rank 1's writes lost", p,
                           [".safetensors", "not the bytes written"], ck)
    # one-writer paths (stdio: the failure surfaces at fsync, as write-back errors do)
    one_writer = [("ddp, FSC_PARALLEL_IO=0", ["--strategy", "ddp"], {"FSC_PARALLEL_IO": "0"}),
                  ("pp 2", ["--strategy", "ddp", "--pp", "2"], {}),
                  ("tp 2", ["--strategy", "ddp", "--tp", "2"], {})]
    for what, flags, extra in one_writer:
        ck = os.path.join(TMP, "io-" + what.split(",")[0].replace(" ", ""))
        env = shim_env(path=".step-000004.tmp", fsync="EIO")
        env.update(extra)
        p = mpiexec(2, *base, *flags, "--checkpoint-dir", ck, "--keep-last", 1, expect_ok=False,
                    env=env)
        expect_failed_save(f"{what}, fsync EIO", p, ["rank 0", "Input/output error", ".safetensors"],
                          ck)
    # state.json itself (fsc's own write): its write fails on rank 0, the root
    ck = os.path.join(TMP, "io-state")
    p = mpiexec(2, *base, "--strategy", "ddp", "--checkpoint-dir", ck, "--keep-last", 1,
                expect_ok=False, env=shim_env(path=".step-000004.tmp", rank=0, write="EIO",
                                              **{"from": 0}))
    expect_failed_save("ddp, every write of rank 0 into step 4 fails", p, ["rank 0"], ck)
    # --save: the final weights under ddp and fsdp; the file already there stays
    for strategy in ("ddp", "fsdp"):
        out = os.path.join(TMP, f"final-{strategy}.safetensors")
        with open(out, "wb") as f:
            f.write(b"the previous weights")
        p = mpiexec(2, *TINY, "--quiet", "--steps", "2", "--strategy", strategy, "--save", out,
                    expect_ok=False, env=shim_env(path=f"final-{strategy}.safetensors.tmp",
                                                  rank=1, write="EIO", **{"from": 0}))
        if p.returncode == 0 or "rank 1" not in p.stderr or out not in p.stderr:
            sys.exit(f"FAIL: --save under {strategy}: exit {p.returncode}, no rank 1 and "
                     f"{out} in:\n{p.stderr}")
        with open(out, "rb") as f:
            if f.read() != b"the previous weights":
                sys.exit(f"FAIL: --save under {strategy}: {out} was changed")
        stray = [x for x in os.listdir(TMP) if x.startswith(f"final-{strategy}.safetensors.")]
        if stray:
            sys.exit(f"FAIL: --save under {strategy}: temporaries left: {stray}")
        print(f"ok  --save under {strategy}, rank 1 EIO: the previous file is unchanged")
    slow_disk()
    shutil.rmtree(TMP, ignore_errors=True)


def slow_disk():
    """A slow disk is not a dead rank: at FSC_TIMEOUT_S=2, rank 0's fsyncs into
    the first checkpoint take 2.1 s each while rank 1 waits for it in fsc, and the
    save completes and commits (before: "world rank 0 is stalled ... outside fsc
    for 2.0 s" on every layout). The file work sits in three busy scopes; with
    any one removed, a case below that reaches it ends in a stall verdict (each
    was removed in turn to check). Under ddp, the MPI-IO save of a member
    (src/io/safetensors_mpiio.c) and the commit (checkpoint.c: checksums, fsyncs,
    renames): rank 0's 3 fsyncs of the directory, 2 in the first scope (one per
    member, while the peer waits in fsc; during a member's own sync it waits in
    MPI_File_sync, outside fsc, so slowing that one tells nothing) and 1 in the
    second. Under pp 2, the one writer's (safetensors_write.c) and the commit
    again: the 2 fsyncs of optim.safetensors, one in each scope. Writes are not
    slowed: MPI-IO's run inside MPI's collective calls, where the peer does not
    wait in fsc, and the one writer's go through stdio, which the shim does not
    see. Slowing every write and fsync of both ranks into the directory (24
    calls) took 50 s, all 8 of rank 0's fsyncs there under ddp 21 s with pp's 2;
    these 5 take 10.5 s."""
    for what, flags, path, on in (("ddp, MPI-IO", ["--strategy", "ddp"], ".step-000002.tmp",
                                   "dirsync"),
                                  ("pp 2, one writer", ["--strategy", "ddp", "--pp", "2"],
                                   "/optim.safetensors", "fsync")):
        ck = os.path.join(TMP, "slow-" + what.split(",")[0].replace(" ", ""))
        env = shim_env(path=path, rank=0, delay_ms=2100, delay_on=on)
        env["FSC_TIMEOUT_S"] = "2"
        p = mpiexec(2, *TINY, "--quiet", "--steps", "3", "--save-every", "2", *flags,
                    "--checkpoint-dir", ck, expect_ok=False, env=env)
        if p.returncode != 0 or verify_checkpoint(ck) != 2:
            sys.exit(f"FAIL: slow disk, {what}: exit {p.returncode}:\n{p.stderr}")
        which = "directory fsyncs of" if on == "dirsync" else "fsyncs into"
        print(f"ok  slow disk (rank 0's {which} {path}: 2.1 s each at FSC_TIMEOUT_S=2), "
              f"{what}: committed")
