#!/usr/bin/env python3
"""Fault injection against fsc's watchdog (issue 13, item 3): does every
survivor name the lost rank, the same way, in time?

    watchdog_faults.py FSC_TRAIN [--kills 20] [--stops 20] [--timeout 3] [--seed 1] [--checkpoint]
    watchdog_faults.py FSC_TRAIN --fast [--lifecycle MPI_LIFECYCLE]   (the ctest, < 60 s)

Each case starts fsc-train (ddp or fsdp, 2-4 ranks, alternating) under
mpiexec with --enable-recovery (Open MPI; -disable-auto-cleanup for MPICH's
Hydra) so that survivors live on and fsc's watchdog acts, waits until a
random step, then sends one rank SIGKILL (a death) or SIGSTOP (a stall) at a
random moment of that step, and times the survivors until they exit. A case
counts as named when every survivor printed a verdict, the verdicts are one
text, and the ranks it blames ("world rank R is lost|stalled") are exactly
the victim; with --checkpoint the run saves every step (so a signal may land
mid-save) and its last committed checkpoint must still verify: every
member's size and CRC-32 as its state.json records (a rank killed inside a
parallel MPI-IO save is found by the heartbeat thread while its peers sit
in MPI-IO's blocking calls: their line is "fsc: the MPI-IO save of ...
cannot complete ..."; the ctest watchdog_faults_checkpoint runs --fast
--checkpoint). The exit time is from the
signal to the last survivor's exit, against FSC_TIMEOUT_S + 1 s. With
--init-stall, a rank also stops itself before MPI_Init: its peers must end
with a message (exit 124) instead of hanging; --as-remote makes ranks see each other as remote peers (the
heartbeat alone decides, without /proc); with --lifecycle (tests/mpi_lifecycle built), a rank stops itself
just before MPI_Finalize and the others must end with a message naming it.
--remote-save SHIM (tests/tools/io_fault_shim.c built) is the case of
issue 29, item 7: ranks as if on other hosts, a checkpoint every step whose
MPI-IO writes the shim slows (100 ms each), the kill sent once a save's
files are being written: the survivors then wait inside MPI-IO, where only
the heartbeat can tell;
each kill must be named within FSC_TIMEOUT_S + 1 s (3 s: it took a fixed
~5.1 s before the probes followed the timeout).
Standard library only (Debian's python3). Exit status 1 if any case
fails its check (--fast: misnamed, or no exit within FSC_TIMEOUT_S + 10 s).
"""
import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

import saved_state  # beside this file: the checkpoint check

MODEL = ["--layers", "1", "--d-model", "32", "--heads", "2", "--seq", "16", "--batch", "2",
         "--steps", "1000000", "--quiet"]
BLAME = re.compile(r"world rank (\d+) (?:is lost|is stalled|has not reached)")
# the heartbeat thread ending a rank stuck in a blocking call: what it was in, then the verdict
EARLY = re.compile(r"^fsc: .* (?:cannot complete \(after [^)]*\)|did not return within [^:]*): (.*); "
                   r"ending this process")
# a survivor's own failure in a step: "fsc-train: rank R: step N: ..." (tools/tool_report.c)
STEP_FAILED = re.compile(r"^fsc-train: rank \d+: (?:step|after step|checkpoint at step) \d+: ")
VERDICT = re.compile(r"(\S+ (?:#\d+ on group|of \d+ \S+ (?:to|from)) .*answer the heartbeat\))")


def launcher():
    exe = os.environ.get("FSC_MPIEXEC", "mpiexec")
    v = subprocess.run([exe, "--version"], capture_output=True, text=True)
    text = v.stdout + v.stderr
    if "Open MPI" in text or "OpenRTE" in text:
        return exe, ["--oversubscribe", "--enable-recovery"]
    if "HYDRA" in text or "hydra" in text:
        return exe, ["-disable-auto-cleanup"]
    return exe, []


def rank_pids(tag):
    """{world rank: pid} of the processes started with FSC_WDF_TAG=tag."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            env = open(f"/proc/{d}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if f"FSC_WDF_TAG={tag}".encode() not in env:
            continue
        exe = os.readlink(f"/proc/{d}/exe") if os.path.exists(f"/proc/{d}/exe") else ""
        if not exe.endswith("fsc-train"):
            continue
        for key in (b"OMPI_COMM_WORLD_RANK=", b"PMI_RANK=", b"PMIX_RANK="):
            v = [e[len(key):] for e in env if e.startswith(key)]
            if v:
                out[int(v[0])] = int(d)
                break
    return out


def gone(pid):
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] in "ZX"


def run_case(train, kind, strategy, np, victim, step, timeout, tmp, exe, flags, rng, checkpoint,
             shim=None):
    tag = f"{os.getpid()}-{time.time_ns()}"
    metrics = os.path.join(tmp, f"m-{tag}.jsonl")
    ck = os.path.join(tmp, f"ck-{tag}")
    env = dict(os.environ, FSC_TIMEOUT_S=str(timeout), FSC_WDF_TAG=tag)
    if shim:  # every write into the checkpoints is slow: the victim dies inside a save
        env.update(LD_PRELOAD=shim, FSC_SHIM_PATH="step-", FSC_SHIM_DELAY_MS="100")
        # a sanitizer build's runtime must come first in the preload list; the shim
        # is a plain library, so that check is turned off (every other stays): left
        # on, ASan refused to start and every kill "missed the save"
        env["ASAN_OPTIONS"] = ":".join(
            x for x in (env.get("ASAN_OPTIONS"), "verify_asan_link_order=0") if x)
    env.pop("FSC_FAULT", None)
    log = open(os.path.join(tmp, f"err-{tag}.txt"), "w+")
    p = subprocess.Popen([exe, "-n", str(np), *flags, train, *MODEL, "--strategy", strategy,
                          "--metrics", metrics,
                          *(["--checkpoint-dir", ck, "--save-every", "1", "--keep-last", "2"]
                            if checkpoint else [])],
                         stdout=subprocess.DEVNULL, stderr=log, env=env)
    res = {"kind": kind, "strategy": strategy, "np": np, "victim": victim, "step": step}
    try:
        t_start = time.time()
        while True:  # until rank 0 has logged `step` steps
            n = sum(1 for _ in open(metrics)) if os.path.exists(metrics) else 0
            if n >= step:
                break
            if p.poll() is not None or time.time() - t_start > 60:
                res.update(ok=False, why="the run ended or never got going")
                return res
            time.sleep(0.005)
        while shim and time.time() - t_start < 60 and p.poll() is None:
            # until a save after the first committed one is writing its files
            # (each write then takes 100 ms)
            tmps = [os.path.join(ck, d) for d in os.listdir(ck) if ".tmp-" in d and d[0] == "."] \
                if os.path.exists(os.path.join(ck, "latest")) else []
            if any(os.path.isdir(d) and os.listdir(d) for d in tmps):
                time.sleep(0.05)
                break
            time.sleep(0.002)
        pids = rank_pids(tag)
        if sorted(pids) != list(range(np)):
            res.update(ok=False, why=f"found ranks {sorted(pids)}")
            return res
        time.sleep(rng.uniform(0, 0.02))  # somewhere inside the step
        os.kill(pids[victim], signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        t0 = time.time()
        survivors = [pid for r, pid in pids.items() if r != victim]
        while not all(gone(x) for x in survivors) and time.time() - t0 < timeout + 30:
            time.sleep(0.01)
        took = time.time() - t0
        hung = not all(gone(x) for x in survivors)
    finally:
        for pid in rank_pids(tag).values():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    log.seek(0)
    err = log.read()
    log.close()
    # a rank lost while the survivors sit in a blocking MPI call (an MPI-IO
    # save): the heartbeat thread ends them with its own line
    # (a verdict met inside a checkpoint save reads "fsc-train: checkpoint at step N: ...")
    lines = [l for l in err.splitlines() if STEP_FAILED.search(l) or EARLY.search(l)
             or (l.startswith("fsc-train: checkpoint at step") and VERDICT.search(l))]
    verdicts = {m.group(1) for l in lines for m in [VERDICT.search(l) or EARLY.search(l)] if m}
    blamed = {int(x) for v in verdicts for x in BLAME.findall(v)}
    named = (not hung and len(lines) == np - 1 and len(verdicts) == 1 and blamed == {victim})
    damaged = saved_state.checkpoint_problem(ck)[1] if checkpoint else ""
    res.update(ok=named and not damaged, took=took, hung=hung, raw=err,
               message=next(iter(verdicts), lines[0] if lines else ""),
               why="" if named and not damaged else f"{len(lines)} survivor messages, "
               f"{len(verdicts)} verdicts, blamed {sorted(blamed)}" + (", HUNG" if hung else "")
               + (f", checkpoint damaged: {damaged}" if damaged else "") + "\n" + err[-3000:])
    return res


def init_stall(train, timeout, exe, flags):
    """Rank 1 stops itself before exec: rank 0 waits in MPI_Init, then must end with a message.
    Without --enable-recovery, so that the launcher then ends the stopped rank too."""
    flags = [f for f in flags if f not in ("--enable-recovery", "-disable-auto-cleanup")]
    env = dict(os.environ, FSC_TIMEOUT_S=str(timeout), FSC_INIT_TIMEOUT_S=str(timeout))
    script = ('r="${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}"; '
              'if [ "$r" = 1 ]; then trap "" CONT; kill -STOP $$; sleep 30; exit 0; fi; exec "$0" "$@"')
    t0 = time.time()
    p = subprocess.Popen([exe, "-n", "2", *flags, "sh", "-c", script, train, *MODEL[:-3], "--steps",
                          "3", "--quiet", "--strategy", "ddp"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, env=env)
    deadline = timeout + 30
    try:
        _, err = p.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
        return False, time.time() - t0, "HUNG:\n" + err[-2000:]
    took = time.time() - t0
    line = next((l for l in err.splitlines() if "MPI_Init_thread" in l and "did not return" in l), "")
    return bool(line), took, line or err[-2000:]


def finalize_stall(lifecycle, timeout, exe, flags):
    """Rank 1 of 3 stops before MPI_Finalize: ranks 0 and 2 must end, naming it, in one text."""
    flags = [f for f in flags if f not in ("--enable-recovery", "-disable-auto-cleanup")]
    env = dict(os.environ, FSC_TEST_STALL_FINALIZE="1")
    t0 = time.time()
    p = subprocess.Popen([exe, "-n", "3", *flags, lifecycle], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        _, err = p.communicate(timeout=timeout + 30)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
        return False, time.time() - t0, "HUNG:\n" + err[-2000:]
    lines = {l for l in err.splitlines() if "MPI_Finalize (fsc_dist_finalize) did not return" in l}
    ok = len(lines) == 1 and {int(x) for l in lines for x in BLAME.findall(l)} == {1}
    return ok, time.time() - t0, "\n".join(lines) if ok else err[-2000:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("train")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--stops", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fast", action="store_true", help="the ctest: 2 kills, 2 stops, the init stall")
    ap.add_argument("--init-stall", action="store_true")
    ap.add_argument("--as-remote", action="store_true",
                    help="FSC_HEARTBEAT_PROC=0: peers as if on other hosts (heartbeat alone, no /proc)")
    ap.add_argument("--checkpoint", action="store_true",
                    help="save every step; the last committed checkpoint must survive the signal")
    ap.add_argument("--lifecycle", help="tests/mpi_lifecycle: also stall a rank before MPI_Finalize")
    ap.add_argument("--remote-save", metavar="SHIM",
                    help="kills inside slowed MPI-IO saves of ranks as if on other hosts, each "
                         "named within FSC_TIMEOUT_S + 1 s (the ctest watchdog_faults_remote_save)")
    a = ap.parse_args()
    if a.fast:
        a.kills, a.stops, a.timeout, a.init_stall = 2, 2, 2.0, True
    if a.remote_save:
        a.kills, a.stops, a.timeout, a.as_remote, a.checkpoint = 4, 0, 3.0, True, True
    if a.as_remote:
        os.environ["FSC_HEARTBEAT_PROC"] = "0"
    exe, flags = launcher()
    if not flags:
        print("skip: the launcher cannot keep survivors alive after a rank dies")
        return 77
    rng = random.Random(a.seed)
    plan = []
    for kind, n in (("kill", a.kills), ("stop", a.stops)):
        for i in range(n):
            np = 2 + (i + (kind == "stop")) % 3
            plan.append((kind, ("ddp", "fsdp")[i % 2], np, rng.randrange(np),
                         0 if a.remote_save else rng.randint(2, 5)))
    failed = 0
    stats = {}
    with tempfile.TemporaryDirectory(prefix="fsc_wdf_") as tmp:
        for kind, strategy, np, victim, step in plan:
            for attempt in range(3 if a.remote_save else 1):
                r = run_case(a.train, kind, strategy, np, victim, step, a.timeout, tmp, exe, flags,
                             rng, a.checkpoint, a.remote_save)
                # a kill that missed the save (a loaded machine) proves nothing here: again
                if not a.remote_save or "cannot complete" in r.get("why", "") + r.get("raw", ""):
                    break
                print(f"(attempt {attempt + 1}: the kill missed the MPI-IO save; again)")
            took = r.get("took", float("nan"))
            in_time = took <= a.timeout + 1.0
            s = stats.setdefault(kind, [0, 0, 0, 0.0])
            s[0] += 1
            s[1] += r["ok"]
            s[2] += r["ok"] and in_time
            s[3] = max(s[3], took if took == took else 0.0)
            print(f"{'ok  ' if r['ok'] else 'FAIL'} {kind:4} {strategy:4} np {np} rank {victim} step "
                  f"{step}: survivors out after {took:.2f} s{'' if in_time else ' (late)'}: "
                  f"{r.get('message', '')[:230]}", flush=True)
            if not r["ok"]:
                print(r["why"])
            late = not in_time and not a.fast
            if not r["ok"] or late or (a.fast and took > a.timeout + 10):
                failed += 1
        for kind, (n, named, timely, worst) in stats.items():
            print(f"{kind}: named correctly {named}/{n}, within FSC_TIMEOUT_S + 1 s ({a.timeout + 1:g} s) "
                  f"{timely}/{n}, slowest {worst:.2f} s")
        if a.init_stall:
            ok, took, line = init_stall(a.train, a.timeout, exe, flags)
            print(f"{'ok  ' if ok else 'FAIL'} MPI_Init stall: ended after {took:.1f} s: {line[:300]}")
            failed += not ok
        if a.lifecycle:
            ok, took, line = finalize_stall(a.lifecycle, a.timeout, exe, flags)
            print(f"{'ok  ' if ok else 'FAIL'} MPI_Finalize stall: ended after {took:.1f} s: {line[:300]}")
            failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
