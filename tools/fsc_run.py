#!/usr/bin/env python3
"""fsc-run: elastic restart around mpiexec (installed as fsc-run).

    fsc-run [--max-restarts K] [--launcher EXE] -n N PROGRAM ARGS...
    fsc-run --version | --help

Runs `mpiexec -n N PROGRAM ARGS` (the launcher keeps the survivors of a
dead rank alive: Open MPI's --enable-recovery, MPICH's -disable-auto-cleanup)
and, when the job ends with fsc's lost-rank verdict (a rank exits with
FSC_DIST_LOST_EXIT, 69, or the survivors print "world rank R is lost"),
starts it again on the survivors' slots from the last committed checkpoint
of PROGRAM's --checkpoint-dir, up to K times. The new world keeps the
checkpoint's global batch (--batch becomes global_batch / (grad_accum x
ranks)), so the restarted run continues the same training; its size is the
largest number of survivors that divides the global batch and is a multiple
of the layout's ranks per replica (--pp x --tp x --cp, and --shard-group).
Each restart appends one line to PROGRAM's --metrics file:
{"event": "restart", "restart": i, "lost_ranks": [...], "exit_status": rc,
 "ranks": n, "from_step": s, "seconds": t}, t the time from the job's end
to the new launch. It starts nothing of its own beyond the launcher.
Exit status: the last job's (0 on success; 69 when restarts ran out).
Standard library only.
"""
import json
import os
import re
import subprocess
import sys
import time

LOST_EXIT = 69  # FSC_DIST_LOST_EXIT, include/fsc/dist.h
VERSION = "@PROJECT_VERSION@"  # CMake writes project()'s version into the built copy
LOST = re.compile(r"world rank (\d+) is lost")


def usage(msg):
    sys.exit(f"fsc-run: {msg}\nusage: fsc-run [--max-restarts K] [--launcher EXE] -n N "
             "PROGRAM ARGS...")


def flag(args, name):
    """The value of --name in args (the last one given), or None."""
    val = None
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            val = args[i + 1]
        elif a.startswith(name + "="):
            val = a.split("=", 1)[1]
    return val


def launcher_flags(exe):
    v = subprocess.run([exe, "--version"], capture_output=True, text=True)
    text = v.stdout + v.stderr
    if "Open MPI" in text or "OpenRTE" in text:
        return ["--oversubscribe", "--enable-recovery"]
    if "HYDRA" in text or "hydra" in text:
        return ["-disable-auto-cleanup"]
    return []


def latest(ckdir):
    """(step, state.json's meta) of ckdir's committed checkpoint, or (None, None)."""
    try:
        name = open(os.path.join(ckdir, "latest")).read().strip()
        state = json.load(open(os.path.join(ckdir, name, "state.json")))
        return state["step"], state["meta"]
    except (OSError, ValueError, KeyError):
        return None, None


def new_world(survivors, per_replica, global_batch, accum):
    """The largest n <= survivors, a multiple of per_replica, over which the
    global batch splits evenly; 0 when none."""
    for n in range(survivors, 0, -1):
        if n % per_replica == 0 and global_batch % (accum * n) == 0:
            return n
    return 0


def without(args, name):
    """args without --name VALUE / --name=VALUE."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == name:
            skip = True
        elif not a.startswith(name + "="):
            out.append(a)
    return out


def run_job(cmd):
    """Runs cmd, passing its stderr through; (status, lost world ranks)."""
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, errors="replace")
    lost = set()
    for line in p.stderr:
        sys.stderr.write(line)
        lost.update(int(r) for r in LOST.findall(line))
    return p.wait(), sorted(lost)


def main(argv):
    max_restarts, exe, n, i = 3, os.environ.get("FSC_MPIEXEC", "mpiexec"), None, 0
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] in ("--max-restarts", "--launcher", "-n", "-np") and i + 1 < len(argv):
            key, val = argv[i], argv[i + 1]
            i += 2
            if key == "--launcher":
                exe = val
                continue
            try:
                num = int(val)
            except ValueError:
                usage(f"{key} \"{val}\": expected a whole number")
            if key == "--max-restarts":
                if num < 0:
                    usage(f"--max-restarts {num} must be >= 0")
                max_restarts = num
            else:
                if num < 1:
                    usage(f"-n {num} must be >= 1")
                n = num
        elif argv[i] in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        elif argv[i] == "--version":
            print(f"fsc-run {VERSION}")
            return 0
        else:
            usage(f"unknown option \"{argv[i]}\" (options come before PROGRAM)")
    prog = argv[i:]
    if n is None or not prog:
        usage("needs -n N and a PROGRAM")
    args = prog[1:]
    ckdir, metrics = flag(args, "--checkpoint-dir"), flag(args, "--metrics")
    if max_restarts > 0 and not ckdir:
        usage("a restart resumes from PROGRAM's --checkpoint-dir: give one (with --save-every)")
    per_replica = 1
    for name in ("--pp", "--tp", "--cp", "--shard-group"):
        v = flag(args, name)
        per_replica *= int(v) if v and v.isdigit() and int(v) > 0 else 1
    flags = launcher_flags(exe)
    for restart in range(max_restarts + 1):
        status, lost = run_job([exe, "-n", str(n), *flags, *prog[:1], *args])
        ended = time.time()
        if not lost and status != LOST_EXIT:
            return status
        if restart == max_restarts:
            print(f"fsc-run: world rank(s) {lost} lost; no restarts left (--max-restarts "
                  f"{max_restarts})", file=sys.stderr)
            return LOST_EXIT
        step, meta = latest(ckdir)
        survivors = n - max(len(lost), 1)
        args = without(without(args, "--resume"), "--batch")
        if meta is None:
            m = n
            batch = flag(prog[1:], "--batch")
            n = survivors
            if batch:  # from scratch: keep the global batch where it splits
                gb, accum = int(batch) * m, int(flag(prog[1:], "--grad-accum") or 1)
                n = new_world(survivors, per_replica, gb, accum)
                args += ["--batch", str(gb // (accum * n))] if n else []
        else:
            gb, accum = meta["global_batch"], meta["saved_by"]["grad_accum"]
            n = new_world(survivors, per_replica, gb, accum)
            args += ["--resume", ckdir, "--batch", str(gb // (accum * n))] if n else []
        if n < 1:
            print(f"fsc-run: {survivors} survivor(s) cannot hold the layout ({per_replica} ranks "
                  "per replica, the global batch split evenly)", file=sys.stderr)
            return LOST_EXIT
        line = {"event": "restart", "restart": restart + 1, "lost_ranks": lost,
                "exit_status": status, "ranks": n, "from_step": step or 0,
                "seconds": round(time.time() - ended, 3)}
        print(f"fsc-run: world rank(s) {lost} lost; restart {restart + 1} of {max_restarts} on "
              f"{n} ranks from step {step or 0}", file=sys.stderr)
        if metrics:
            with open(metrics, "a") as f:
                f.write(json.dumps(line) + "\n")
    return LOST_EXIT


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
