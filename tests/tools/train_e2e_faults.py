"""fsc-train end to end, when things go wrong: bad input refused clearly, a lost or
stopped rank ends the job, a signal checkpoints and exits, inconsistent launches and bad
values are refused, and a checkpoint resumes under other layouts with nothing saved harmed."""
import os
import subprocess
import sys

import saved_state  # beside this file
from train_e2e_common import (FSC_TRAIN, TINY, TMP, expect_refused, metrics, mpiexec, run,
                              same_tree, verify_checkpoint)


def bad_input():
    garbage = os.path.join(TMP, "garbage.safetensors")
    with open(garbage, "wb") as f:
        f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    other = os.path.join(TMP, "other.safetensors")
    run(*TINY, "--steps", "0", "--save-init", other, "--quiet")
    cases = [
        (["--heads", "3"], "heads 3 must divide d_model 256"),
        (["--steps", "abc"], "--steps: \"abc\" is not a valid integer"),
        (["--bogus", "1"], "unknown flag"),
        (["--batch"], "--batch needs a value"),
        (["--batch", "0"], "--batch 0 must be positive"),
        (["--data", "/nonexistent/x.bin"], "/nonexistent/x.bin"),
        (["--init-from", garbage], garbage),
        (["--d-model", "128", "--init-from", other], "has shape"),
        (["--optimizer", "lion"], "--optimizer \"lion\""),
        (["--strategy", "zero"], "--strategy \"zero\""),
        (["--save-every", "5"], "--save-every needs --checkpoint-dir"),
        (["--resume", "/nonexistent/ck"], "no checkpoint here"),
        (["--strategy", "oss", "--partition", "round-robin"], "--partition \"round-robin\""),
        (["--strategy", "ddp", "--bucket-mb", "0"], "--bucket-mb 0 must be positive"),
        (["--strategy", "ddp", "--bucket-mb", "-5"], "--bucket-mb -5 must be positive"),
        (["--strategy", "dp", "--threads", "16", "--batch", "4"], "cannot be split"),
        (["--schedule", "step"], "--schedule \"step\""),
        (["--lr", "-1"], "lr"),
        (["--vocab", "100"], "raise --vocab"),
        (["--save", "/nonexistent-dir/m.safetensors", "--steps", "1"], "/nonexistent-dir"),
    ]
    for args, needle in cases:
        p = run(*args, expect_ok=False)
        msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
        expect_refused(p, needle, args)
        print(f"ok  {' '.join(args)[:60]:60s} -> {msg[:110]}")


def watchdog():
    """A rank that stops participating (sleeps) or exits mid-run: the job ends
    non-zero within the short timeout, naming the missing rank; nothing hangs."""
    import time
    common = ["--layers", "1", "--d-model", "32", "--heads", "2", "--seq", "16", "--batch", "2",
              "--steps", "5", "--strategy", "ddp", "--quiet"]
    for fault in ("sleep@1:3", "exit@1:3"):
        env = dict(os.environ, FSC_TIMEOUT_S="3", FSC_FAULT=fault)
        launcher = os.environ.get("FSC_MPIEXEC", "mpiexec")
        ck = os.path.join(TMP, f"wd-{fault[:5]}")  # step 2's checkpoint must outlive the fault
        t0 = time.time()
        p = subprocess.run([launcher, "-n", "2", "--oversubscribe", FSC_TRAIN, *common,
                            "--checkpoint-dir", ck, "--save-every", "2"],
                           capture_output=True, text=True, timeout=120, env=env)
        took = time.time() - t0
        if p.returncode == 0:
            sys.exit(f"FAIL: {fault}: the job exited 0:\n{p.stderr}")
        if took > 60:
            sys.exit(f"FAIL: {fault}: the job took {took:.0f} s to fail")
        if fault.startswith("sleep") and not ("never joined" in p.stderr and "rank 1" in p.stderr):
            sys.exit(f"FAIL: {fault}: no watchdog message naming rank 1:\n{p.stderr}")
        if verify_checkpoint(ck) != 2:
            sys.exit(f"FAIL: {fault}: the latest checkpoint is not step 2's:\n{p.stderr}")
        line = next((l for l in p.stderr.splitlines() if "never joined" in l), "(launcher ended the job)")
        print(f"ok  FSC_FAULT={fault}: exit {p.returncode} after {took:.1f} s: {line.strip()[:150]}"
              "; step 2's checkpoint verifies")
    # a pipeline stage that stops mid-step: its peer's receive or send times
    # out, naming this rank, the action and the rank it waits for
    env = dict(os.environ, FSC_TIMEOUT_S="3", FSC_FAULT="sleep@1:3")
    launcher = os.environ.get("FSC_MPIEXEC", "mpiexec")
    t0 = time.time()
    p = subprocess.run([launcher, "-n", "2", "--oversubscribe", FSC_TRAIN, *common[:-1], "--pp",
                        "2", "--grad-accum", "2", "--layers", "2"],
                       capture_output=True, text=True, timeout=120, env=env)
    took = time.time() - t0
    named = [l for l in p.stderr.splitlines() if "pipeline rank 0" in l and "rank 1" in l]
    if p.returncode == 0 or took > 60 or not named:
        sys.exit(f"FAIL: a pipeline stage that sleeps: exit {p.returncode} after {took:.0f} s:\n"
                 f"{p.stderr}")
    print(f"ok  --pp 2, stage 1 sleeps: exit {p.returncode} after {took:.1f} s: {named[0].strip()[:220]}")
    # a pipeline stage killed (SIGKILL) between steps: its peer is mid-step in a send or
    # receive. Open MPI's --enable-recovery keeps the survivor alive so fsc's watchdog acts
    # and names rank 1 and the action; other launchers end the job themselves.
    version = subprocess.run([launcher, "--version"], capture_output=True, text=True).stdout
    recovery = ["--enable-recovery"] if "OpenRTE" in version or "Open MPI" in version else []
    env = dict(os.environ, FSC_TIMEOUT_S="3", FSC_FAULT="kill@1:3")
    t0 = time.time()
    p = subprocess.run([launcher, "-n", "2", "--oversubscribe", *recovery, FSC_TRAIN, *common[:-1],
                        "--pp", "2", "--grad-accum", "2", "--layers", "2"],
                       capture_output=True, text=True, timeout=120, env=env)
    took = time.time() - t0
    named = [l for l in p.stderr.splitlines() if "pipeline rank 0" in l and "rank 1" in l]
    # (under --enable-recovery Open MPI 4.1's launcher exits 0 whatever the survivors return)
    if took > 3 + 30 or (not named if recovery else p.returncode == 0):
        sys.exit(f"FAIL: a pipeline stage killed: exit {p.returncode} after {took:.0f} s:\n"
                 f"{p.stderr}")
    line = named[0].strip()[:220] if named else "(launcher ended the job)"
    print(f"ok  --pp 2, stage 1 killed: exit {p.returncode} after {took:.1f} s: {line}")


def resume():
    """Save with 2 ranks (oss) at step 5, resume with 1, 3 and 4 ranks (and under
    ddp) to step 10: the losses of an uninterrupted run. Torn, altered and
    other-model checkpoints are refused and the previous checkpoint survives."""
    common = ["--layers", "2", "--d-model", "64", "--heads", "4", "--seq", "32", "--quiet",
              "--dropout", "0.1"]
    ck = os.path.join(TMP, "ck")
    full = os.path.join(TMP, "full.jsonl")
    mpiexec(2, *common, "--strategy", "oss", "--batch", "6", "--steps", "10", "--metrics", full)
    mpiexec(2, *common, "--strategy", "oss", "--batch", "6", "--steps", "5", "--save-every", "5",
            "--checkpoint-dir", ck)
    ref = [r["loss"] for r in metrics(full)][5:]
    print(f"uninterrupted, 2 ranks (oss)     steps 6-10: " + " ".join(f"{v:.5f}" for v in ref))
    for n, strategy in ((1, "oss"), (3, "oss"), (4, "sdp"), (2, "ddp")):
        m = os.path.join(TMP, f"resume{n}{strategy}.jsonl")
        # --save-every 0: each resume starts at step 5 (a resume keeps the run's --save-every)
        mpiexec(n, *common, "--strategy", strategy, "--batch", str(12 // n), "--steps", "10",
                "--resume", ck, "--metrics", m, "--save-every", "0")
        got = [r["loss"] for r in metrics(m)]
        assert [r["step"] for r in metrics(m)] == list(range(6, 11))
        rel = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
        print(f"resumed with {n} rank(s) ({strategy})     steps 6-10: "
              + " ".join(f"{v:.5f}" for v in got) + f"  (max rel {rel:.1e})")
        if rel > 1e-5:  # measured at most 2.0e-7 under Haswell and SkylakeX: 50x headroom
            sys.exit(f"FAIL: resuming with {n} ranks ({strategy}) changed the losses by {rel:.2e}")
    # damage: a torn optimizer file, then a model mismatch; the checkpoint itself is untouched
    step_dir = os.path.join(ck, "step-000005")
    optim = os.path.join(step_dir, "optim.safetensors")
    good = open(optim, "rb").read()
    saved = saved_state.tree(ck)
    with open(optim, "wb") as f:
        f.write(good[: len(good) // 2])
    p = run(*common, "--steps", "10", "--resume", ck, expect_ok=False)
    expect_refused(p, "optim.safetensors has", "torn checkpoint")
    print("ok  torn checkpoint ->", p.stderr.strip().splitlines()[-1][:140])
    with open(optim, "wb") as f:
        f.write(good)
    p = run("--layers", "3", "--d-model", "64", "--heads", "4", "--seq", "32", "--quiet",
            "--steps", "10", "--resume", ck, expect_ok=False)
    expect_refused(p, "another model", "other-model checkpoint")
    print("ok  other model ->", p.stderr.strip().splitlines()[-1][:140])
    same_tree("refused resumes", ck, saved)
    run(*common, "--steps", "6", "--resume", ck)  # still loadable after both refusals
    print("ok  the refused resumes left every file of the checkpoint as it was")


def find_rank(launcher_pid, rank):
    """The pid of MPI rank `rank` of fsc-train among launcher_pid's descendants, or None."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0].decode()
            if cmd != FSC_TRAIN or not ({f"OMPI_COMM_WORLD_RANK={rank}".encode(),
                                         f"PMIX_RANK={rank}".encode()} & set(env)):
                continue
            p = int(pid)
            while p > 1 and p != launcher_pid:
                p = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
            if p == launcher_pid:
                return int(pid)
        except (OSError, ValueError, IndexError):
            continue
    return None


def signals():
    """SIGTERM to one rank of two: both finish the step, a checkpoint is written, the job exits
    75 within a time limit, --keep-last 2 leaves two checkpoints, and resuming from it gives the
    losses of an uninterrupted run. Without --checkpoint-dir: exit 75, nothing saved."""
    import signal
    import time
    args = ["--strategy", "ddp", *TINY, "--schedule", "constant", "--quiet", "--dropout", "0.1"]
    ck = os.path.join(TMP, "ck")
    m = os.path.join(TMP, "m.jsonl")
    launcher = os.environ.get("FSC_MPIEXEC", "mpiexec")
    job = subprocess.Popen([launcher, "-n", "2", "--oversubscribe", FSC_TRAIN, *args, "--steps",
                            "1000000", "--checkpoint-dir", ck, "--save-every", "3",
                            "--keep-last", "2", "--metrics", m],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (os.path.exists(m) and len(open(m).readlines()) >= 7):
        time.sleep(0.1)
    pid = find_rank(job.pid, 1)
    if pid is None:
        job.kill()
        sys.exit("FAIL: rank 1 of the job was not found (or it trained no 7 steps in 120 s)")
    os.kill(pid, signal.SIGTERM)
    t0 = time.time()
    try:
        _, err = job.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        job.kill()
        sys.exit("FAIL: the job did not end within 60 s of SIGTERM to rank 1")
    last = metrics(m)[-1]["step"]
    steps = sorted(d for d in os.listdir(ck) if d.startswith("step-"))
    print(f"SIGTERM to rank 1 (pid {pid}): exit {job.returncode} after {time.time() - t0:.1f} s; "
          f"last step {last}; checkpoints {steps}")
    line = next((l for l in err.splitlines() if "SIGTERM: stopped after step" in l), None)
    if job.returncode != 75 or line is None:
        sys.exit(f"FAIL: expected exit 75 and a message, got {job.returncode}:\n{err}")
    if steps[-1] != f"step-{last:06d}" or len(steps) != 2:
        sys.exit(f"FAIL: expected step-{last:06d} and one before it (--keep-last 2): {steps}")
    print("   " + line)
    ref = os.path.join(TMP, "ref.jsonl")
    mpiexec(2, *args, "--steps", last + 3, "--metrics", ref)
    mr = os.path.join(TMP, "mr.jsonl")
    mpiexec(2, "--resume", ck, "--steps", last + 3, "--metrics", mr, "--quiet")
    got, want = [r["loss"] for r in metrics(mr)], [r["loss"] for r in metrics(ref)][last:]
    rel = max(abs(a - b) / abs(b) for a, b in zip(got, want))
    if len(got) != 3 or rel > 1e-5:  # measured 0 (bit for bit) under Haswell and SkylakeX
        sys.exit(f"FAIL: resumed after SIGTERM: {got} vs uninterrupted {want}")
    print(f"ok  resumed: steps {last + 1}-{last + 3} as the uninterrupted run (max rel {rel:.1e})")
    m = os.path.join(TMP, "single.jsonl")
    job = subprocess.Popen([FSC_TRAIN, *TINY, "--steps", "1000000", "--metrics", m, "--quiet"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while job.poll() is None and not (os.path.exists(m) and len(open(m).readlines()) >= 3):
        time.sleep(0.05)
    job.send_signal(signal.SIGINT)
    _, err = job.communicate(timeout=60)
    if job.returncode != 75 or "SIGINT: stopped after step" not in err or "nothing saved" not in err:
        sys.exit(f"FAIL: SIGINT without --checkpoint-dir: exit {job.returncode}:\n{err}")
    print("ok  SIGINT, one process:", err.strip().splitlines()[-1])


def consistency():
    """Launch consistency (ranks launched with different settings are refused on
    every rank, naming the flag and the ranks) and value checks (each bad value
    refused with its range)."""
    launcher = os.environ.get("FSC_MPIEXEC", "mpiexec")
    small = [*TINY, "--strategy", "ddp", "--steps", "1", "--quiet"]

    def mpmd(a, b, wdirs=None):
        apps = []
        for i, args in enumerate((a, b)):
            apps += ([":"] if i else []) + ["-n", "1"] + (["-wdir", wdirs[i]] if wdirs else [])
            apps += [FSC_TRAIN, *map(str, args)]
        cmd = [launcher, "--oversubscribe", *apps]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300), " ".join(cmd)

    # a checkpoint saved before; the refused launch would save into the same directory
    ck = os.path.join(TMP, "cons-ck")
    run(*TINY, "--steps", "1", "--quiet", "--checkpoint-dir", ck, "--save-every", "1")
    saved = saved_state.tree(ck)
    keep = ["--checkpoint-dir", ck, "--save-every", "1"]
    p, cmd = mpmd([*small, *keep], [*small, *keep, "--lr", "0.1"])
    same_tree("a launch refused for differing flags", ck, saved)
    for needle in ("rank 0: the ranks were launched with different settings",
                   "rank 1: the ranks were launched with different settings",
                   "--lr: rank 0 vs rank 1"):
        expect_refused(p, needle, cmd)
    if "--batch" in p.stderr or "--data" in p.stderr:
        sys.exit(f"FAIL: {cmd}: names a flag that does not differ:\n{p.stderr}")
    print("ok  --lr differing between two MPMD ranks: refused on both, naming --lr and the ranks")

    # the same --data path on both ranks, different contents of the same size
    dirs = [os.path.join(TMP, f"wd{i}") for i in range(2)]
    for i, d in enumerate(dirs):
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "text.txt"), "w") as f:
            f.write(("abcdefgh" if i == 0 else "hgfedcba") * 4096)
    p, cmd = mpmd([*small, "--data", "text.txt"], [*small, "--data", "text.txt"], dirs)
    needle = "--data (contents: size, crc32 of first/last 64 KiB): rank 0 vs rank 1"
    if p.returncode == 0 or needle not in p.stderr or "--data:" in p.stderr:
        sys.exit(f"FAIL: {cmd}: exit {p.returncode}, expected {needle!r} alone in:\n{p.stderr}")
    print("ok  --data with the same path and size but other contents: named")

    # flags that may differ per rank by design: --metrics, --threads, --log-every
    m = os.path.join(TMP, "cons.jsonl")
    p, cmd = mpmd([*small, "--metrics", m, "--threads", "1"], [*small, "--threads", "2",
                                                              "--log-every", "3"])
    if p.returncode != 0 or len(metrics(m)) != 1:
        sys.exit(f"FAIL: {cmd}: per-rank flags refused (exit {p.returncode}):\n{p.stderr}")
    print("ok  --metrics, --threads and --log-every may differ per rank")

    cases = [
        ([], {"FSC_MEM_LIMIT_MB": "abc"}, "FSC_MEM_LIMIT_MB=abc: expected a number of MiB in [0, "),
        ([], {"FSC_LOG_LEVEL": "loud"},
         "FSC_LOG_LEVEL=loud: expected one of debug, info, warn, error, off"),
        ([], {"FSC_BF16_GEMM": "fast"}, "FSC_BF16_GEMM=fast: expected auto, on, off"),
        ([], {"FSC_NUM_THREADS": "-2"}, "FSC_NUM_THREADS=-2: expected an integer in [1, 1024]"),
        (["--grad-accum", "2147483647"], {}, "--grad-accum 2147483647 is out of range: expected "
                                             "an integer in [1, 65536]"),
        (["--clip", "nan"], {}, "--clip nan is out of range: expected a number in [0, "),
        (["--seed", "-1"], {}, "--seed -1 is out of range: expected an integer in [0, "
                               "18446744073709551615]"),
        (["--lr", "inf"], {}, "--lr inf is out of range: expected a number in [0, 100]"),
        (["--steps", "99999999999"], {}, "expected an integer in [0, 34359738368]"),
        (["--batch", "65536", "--grad-accum", "65536", "--seq", "65536", "--steps", "100000"], {},
         "tokens: expected fewer than 2^62"),
    ]
    for args, env, needle in cases:
        p = subprocess.run([FSC_TRAIN, *TINY, "--steps", "1", *args], capture_output=True,
                           text=True, timeout=300, env={**os.environ, **env})
        expect_refused(p, needle, f"{args} {env}")
        print(f"ok  {' '.join(args) or env} -> {p.stderr.strip().splitlines()[-1][:100]}")
