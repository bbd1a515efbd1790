"""--async-save end to end: checkpoints written by a background thread.

equal: the checkpoint directories of a run with --async-save are byte for byte
those of the same run saving synchronously (single, ddp 2, fsdp 2, ddp 2 with
the one-writer path, pp 2), and tp 2 falls back to synchronous saves with a
one-line notice. faults: a write into the background save failing on one rank
(the syscall shim, tests/tools/io_fault_shim.c) ends the run non-zero naming
the rank and the file, `latest` on the previous checkpoint, nothing of the
torn save left; a slow disk (rank 0's fsyncs 1 s each at FSC_TIMEOUT_S=2)
delays the next save, which waits for the one in flight, and everything
commits. kill: the process killed at every commit point of a background save
(the last two: the pruning after it), and while its thread writes: the newest complete checkpoint is the previous
one (or the new one once renamed into place, as for a synchronous save), it
verifies, and a run resumed from it finishes and commits."""
import os
import shutil
import signal
import subprocess
import sys
import time

from train_e2e_common import FSC_TRAIN, TINY, TMP, verify_checkpoint
from train_e2e_io import SHIM, expect_failed_save, require_shim, shim_env

POINTS = 11  # FSC_CKPT_POINTS (src/core/fault.h)
RENAMED = 5  # FSC_CKPT_POINT_RENAMED: from here on the new step directory is complete
LATEST = 8  # FSC_CKPT_POINT_LATEST: from here on `latest` names it


def launch(n, args, cwd=None, env=None, expect_ok=True):
    cmd = [FSC_TRAIN, *map(str, args)]
    if n > 1:
        cmd = [os.environ.get("FSC_MPIEXEC", "mpiexec"), "-n", str(n), "--oversubscribe", *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=cwd,
                       start_new_session=True)
    if expect_ok and p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} (in {cwd}) exited {p.returncode}:\n{p.stderr}")
    return p


def tree(root):
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                out[os.path.relpath(os.path.join(d, f), root)] = fh.read()
    return out


def equal():
    base = [*TINY, "--quiet", "--steps", "6", "--save-every", "2", "--checkpoint-dir", "ck"]
    cases = [("single", 1, [], {}), ("ddp 2", 2, ["--strategy", "ddp"], {}),
             ("fsdp 2", 2, ["--strategy", "fsdp"], {}),
             ("ddp 2, one writer", 2, ["--strategy", "ddp"], {"FSC_PARALLEL_IO": "0"}),
             ("pp 2", 2, ["--strategy", "ddp", "--pp", "2"], {}),
             ("tp 2", 2, ["--strategy", "ddp", "--tp", "2"], {})]
    for what, n, flags, extra in cases:
        env = dict(os.environ, **extra)
        dirs = []
        for mode in ("sync", "async"):
            d = os.path.join(TMP, f"eq-{what.replace(' ', '').replace(',', '')}-{mode}")
            os.makedirs(d)
            p = launch(n, [*base, *flags, *(["--async-save"] if mode == "async" else [])], cwd=d,
                       env=env)
            dirs.append(os.path.join(d, "ck"))
        notice = "checkpoints are saved synchronously" in p.stderr
        if notice != (what == "tp 2"):
            sys.exit(f"FAIL: async {what}: fallback notice {'shown' if notice else 'missing'}:\n"
                     f"{p.stderr}")
        a, b = tree(dirs[0]), tree(dirs[1])
        if sorted(a) != sorted(b) or len(a) != 3 * 3 + 1:
            sys.exit(f"FAIL: async {what}: files {sorted(b)}, synchronous {sorted(a)}")
        diff = [k for k in a if a[k] != b[k]]
        if diff:
            sys.exit(f"FAIL: async {what}: differs from the synchronous save in {diff}")
        print(f"ok  async = sync byte for byte, {what} ({len(a)} files)"
              f"{': synchronous, with the notice' if notice else ''}")


def faults():
    require_shim()
    base = [*TINY, "--quiet", "--steps", "6", "--save-every", "2", "--async-save"]
    for strategy, err in (("ddp", "EIO"), ("fsdp", "ENOSPC")):
        ck = os.path.join(TMP, f"fault-{strategy}")
        p = launch(2, [*base, "--strategy", strategy, "--checkpoint-dir", ck, "--keep-last", 1],
                   expect_ok=False, env=shim_env(path=".step-000004.tmp", rank=1, write=err,
                                                 **{"from": 300000}))
        expect_failed_save(f"async {strategy}, rank 1's background writes {err}", p,
                      ["rank 1", ".safetensors", "in the background", os.strerror(
                          {"EIO": 5, "ENOSPC": 28}[err])], ck)
    # writes that report success but land as zeros: each rank reads its own bytes
    # back (the commit re-reads nothing), on a parallel file and on a one-writer one
    for what, rank, extra in (("ddp", 1, {}), ("ddp one writer", 0, {"FSC_PARALLEL_IO": "0"})):
        ck = os.path.join(TMP, "garble-" + what.replace(" ", "-"))
        env = shim_env(path=".step-000004.tmp", rank=rank, write="GARBLE", **{"from": 300000})
        env.update(extra)
        p = launch(2, [*base, "--strategy", "ddp", "--checkpoint-dir", ck, "--keep-last", 1],
                   expect_ok=False, env=env)
        expect_failed_save(f"async {what}, rank {rank}'s background writes lost", p,
                      [f"rank {rank}", ".safetensors", "not the bytes written"], ck)
    ck = os.path.join(TMP, "fault-onewriter")
    env = shim_env(path=".step-000004.tmp", rank=0, fsync="EIO")
    env["FSC_PARALLEL_IO"] = "0"
    p = launch(2, [*base, "--strategy", "ddp", "--checkpoint-dir", ck, "--keep-last", 1],
               expect_ok=False, env=env)
    expect_failed_save("async ddp one writer, rank 0's fsync EIO", p,
                  ["rank 0", ".safetensors", "Input/output error"], ck)
    # a slow disk: the save at step 4 waits for step 2's (rank 0's fsyncs into it take
    # 1 s each, about 8 s in all) past FSC_TIMEOUT_S, and every save commits
    ck = os.path.join(TMP, "slow")
    env = shim_env(path=".step-000002.tmp", rank=0, delay_ms=1000, delay_on="fsync")
    env.update(FSC_TIMEOUT_S="2", FSC_LOG_LEVEL="debug")
    p = launch(2, [*base, "--steps", "4", "--strategy", "ddp", "--checkpoint-dir", ck],
               expect_ok=False, env=env)
    if p.returncode != 0 or verify_checkpoint(ck) != 4 or "step-000002" not in os.listdir(ck):
        sys.exit(f"FAIL: slow disk: exit {p.returncode}:\n{p.stderr}")
    log = [x for x in p.stderr.splitlines() if "async save:" in x and "rank 0" in x]
    order = [i for i, x in enumerate(log) for key in ("waits for checkpoint step-000002",
                                                      "checkpoint step-000002 committed",
                                                      "checkpoint step-000004 staged") if key in x]
    if len(order) != 3 or order != sorted(order):
        sys.exit("FAIL: slow disk: the save of step 4 did not wait for step 2's commit:\n" +
                 "\n".join(log))
    print("ok  slow disk (rank 0's fsyncs 1 s each at FSC_TIMEOUT_S=2): step 4's save waited "
          "for step 2's commit; both committed")


def kill():
    base = [*TINY, "--quiet", "--save-every", "2"]
    first = os.path.join(TMP, "kill-base")
    launch(1, [*base, "--steps", "2", "--checkpoint-dir", first])
    for k in range(1, POINTS + 1):
        ck = os.path.join(TMP, f"kill{k:02d}")
        shutil.copytree(first, ck)
        # --keep-last 1: points 10 and 11 are the pruning of step 2 after step 4's commit
        p = launch(1, [*base, "--steps", "4", "--resume", ck, "--checkpoint-dir", ck,
                       "--async-save", "--keep-last", 1], expect_ok=False,
                   env=dict(os.environ, FSC_FAULT=f"ckpt@0:{k}"))
        if p.returncode != -signal.SIGKILL:
            sys.exit(f"FAIL: FSC_FAULT=ckpt@0:{k} in a background save: exit {p.returncode}:\n{p.stderr}")
        step = verify_checkpoint(ck)  # `latest`'s, every member checked
        if step != (4 if k >= LATEST else 2):
            sys.exit(f"FAIL: ckpt@0:{k}: latest names step {step}")
        # renamed into place (and fsynced before its rename): a reader adopts it
        if (os.path.isdir(os.path.join(ck, "step-000004")) != (k >= RENAMED) or
                os.path.isdir(os.path.join(ck, "step-000002")) != (k < POINTS - 1)):
            sys.exit(f"FAIL: ckpt@0:{k}: left {sorted(os.listdir(ck))}")
        launch(1, [*base, "--steps", "6", "--resume", ck, "--checkpoint-dir", ck, "--async-save"])
        if verify_checkpoint(ck) != 6:
            sys.exit(f"FAIL: ckpt@0:{k}: the resumed run did not commit step 6")
        print(f"ok  killed at commit point {k} of a background save: latest step {step}"
              f"{', step 4 complete beside it' if RENAMED <= k < LATEST else ''}; resumed to 6")
    # killed while the thread writes (its writes slowed: 1.5 s each), before any commit point
    if SHIM and os.path.exists(SHIM):
        ck = os.path.join(TMP, "kill-writing")
        shutil.copytree(first, ck)
        env = shim_env(path=".step-000004.tmp", delay_ms=1500)
        proc = subprocess.Popen([FSC_TRAIN, *base, "--steps", "6", "--resume", ck,
                                 "--checkpoint-dir", ck, "--async-save"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while time.time() < deadline and not any(
                x.startswith(".step-000004.tmp") and os.listdir(os.path.join(ck, x))
                for x in os.listdir(ck)):
            time.sleep(0.05)
        time.sleep(0.5)  # inside the first slowed write
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if verify_checkpoint(ck) != 2:
            sys.exit("FAIL: killed while writing: latest moved")
        launch(1, [*base, "--steps", "6", "--resume", ck, "--checkpoint-dir", ck])
        left = sorted(os.listdir(ck))
        if verify_checkpoint(ck) != 6 or any(x.startswith(".") for x in left):
            sys.exit(f"FAIL: killed while writing: after the resumed run: {left}")
        print("ok  killed while the background thread wrote step 4: step 2 newest, resumed to "
              "6, the dead save's temporaries removed")
