#!/usr/bin/env python3
"""fsc-train's progress output end to end.

- Under mpirun with no controlling terminal (a new session), stderr a pipe:
  one run header line, then plain lines at least every --log-seconds, with
  MFU and memory; metrics rows carry time, elapsed_s, mfu and peak_mib.
- One process with stderr on a pseudo-terminal: the live line is redrawn.
- Under mpirun inside a pseudo-terminal (the controlling terminal) with the
  launcher's stdout and stderr sent to files: rank 0 draws the live line on
  the terminal (carriage returns, MFU, memory, ETA) and no step line reaches
  stderr; with --progress plain the lines go to stderr and none to the terminal.

usage: progress_e2e.py FSC_TRAIN     Exit 0 = pass, 1 = fail.
"""
import json
import os
import pty
import select
import subprocess
import sys
import tempfile
import time

FSC_TRAIN = sys.argv[1]
LAUNCHER = os.environ.get("FSC_MPIEXEC", "mpiexec")
TMP = tempfile.mkdtemp(prefix="fsc-progress-")
MODEL = ["--layers", "2", "--d-model", "128", "--heads", "4", "--seq", "64", "--batch", "8"]
TINY = ["--layers", "2", "--d-model", "64", "--heads", "4", "--seq", "32", "--batch", "4"]


def fail(msg):
    sys.exit("FAIL: " + msg)


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def pipe_under_mpirun():
    m = os.path.join(TMP, "m.jsonl")
    t0 = time.time()
    # a new session: no controlling terminal, so rank 0 must fall back to plain lines
    p = subprocess.run([LAUNCHER, "-n", "2", "--oversubscribe", FSC_TRAIN, "--strategy", "ddp",
                        *MODEL, "--steps", "40", "--log-every", "100000", "--log-seconds", "0.2",
                        "--metrics", m], capture_output=True, text=True, timeout=600,
                       start_new_session=True)
    t1 = time.time()
    if p.returncode != 0:
        fail(f"mpiexec fsc-train exited {p.returncode}:\n{p.stderr}")
    headers = [l for l in p.stderr.splitlines() if l.startswith("fsc-train: GPT L2 C128")]
    if len(headers) != 1 or "ddp on 2 ranks" not in headers[0] or "seed 1337" not in headers[0]:
        fail(f"expected one run header from rank 0, got {headers}:\n{p.stderr}")
    print("ok  run header: " + headers[0])
    lines = [l for l in p.stderr.splitlines() if l.startswith("step ")]
    rows = metrics(m)
    elapsed = {r["step"]: r["elapsed_s"] for r in rows}
    printed = [int(l.split()[1].split("/")[0]) for l in lines]
    # a line after step b, the previous one after step a: by step b - 1 no 0.2 s had passed
    gap = max(elapsed[b - 1] - elapsed[a] for a, b in zip(printed, printed[1:]))
    print(f"under mpirun, {elapsed[40]:.2f} s of training: {len(lines)} progress lines, "
          f"at most {gap:.2f} s without one (--log-seconds 0.2)")
    print("   " + lines[-1])
    if "\r" in p.stderr:
        fail("a carriage return in the plain lines (no terminal here)")
    if printed[0] != 1 or printed[-1] != 40 or gap > 0.35 or \
            (elapsed[40] > 0.6 and len(printed) < 3) or \
            not all("elapsed, ETA" in l and " MFU " in l and " MiB " in l for l in lines):
        fail("progress lines through a pipe too rare, or no elapsed/ETA/MFU/memory:\n" + p.stderr)
    if not all(t0 - 1 <= r["time"] <= t1 + 1 for r in rows) or \
            any(b["elapsed_s"] < a["elapsed_s"] for a, b in zip(rows, rows[1:])):
        fail(f"metrics time/elapsed_s wrong: {rows[0]} ... {rows[-1]}")
    # the peak of all tags is at least what the row's tags hold now; MFU a share of the peak
    for r in rows:
        now = sum(r["mem"].values()) / 2**20
        if not (r["peak_mib"] >= now - 0.01 and r["peak_mib"] > 0 and 0 < r["mfu"] < 10):
            fail(f"step {r['step']}: peak_mib {r['peak_mib']} vs {now:.2f} MiB held now, "
                 f"mfu {r.get('mfu')}")
    print(f"ok  metrics rows carry time ({rows[0]['time']:.0f}), elapsed_s, mfu "
          f"({rows[-1]['mfu']:.3f}) and peak_mib ({rows[-1]['peak_mib']:.1f})")


def read_all(fd, deadline):
    out = b""
    while time.time() < deadline:
        r, _, _ = select.select([fd], [], [], 1.0)
        if not r:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the terminal's last writer is gone
            break
        if not chunk:
            break
        out += chunk
    return out.decode(errors="replace")


def pty_single():
    master, slave = pty.openpty()
    q = subprocess.Popen([FSC_TRAIN, *TINY, "--steps", "30", "--log-every", "100000"],
                         stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    text = read_all(master, time.time() + 300)
    q.wait()
    os.close(master)
    redraws = text.count("\r\x1b[Kstep ")
    print(f"one process, stderr a terminal: {redraws} redraws of the live line")
    if q.returncode != 0 or redraws < 30 or "ETA" not in text or "step 30/30" not in text or \
            " MFU " not in text or " MiB " not in text:
        fail(f"no live line on a terminal:\n{text[-2000:]}")


def mpirun_in_pty(*extra):
    """mpiexec -n 2 fsc-train in a new pseudo-terminal (its controlling terminal), with the
    launcher's stdout and stderr in files: returns (terminal text, stderr text, status)."""
    out, err = os.path.join(TMP, "out.txt"), os.path.join(TMP, "err.txt")
    cmd = [LAUNCHER, "-n", "2", "--oversubscribe", FSC_TRAIN, "--strategy", "ddp", *TINY,
           "--steps", "20", "--log-every", "100000", *extra]
    pid, master = pty.fork()
    if pid == 0:  # the child: a session leader whose controlling terminal is the pty
        try:
            fo = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            fe = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fo, 1)
            os.dup2(fe, 2)
            os.execvp(cmd[0], cmd)
        finally:
            os._exit(127)
    text = read_all(master, time.time() + 300)
    _, status = os.waitpid(pid, 0)
    os.close(master)
    with open(err) as f:
        return text, f.read(), os.waitstatus_to_exitcode(status)


def tty_under_mpirun():
    text, err, rc = mpirun_in_pty()
    redraws = text.count("\r\x1b[Kstep ")
    print(f"under mpirun in a terminal: {redraws} redraws of the live line on /dev/tty; "
          f"{sum(l.startswith('step ') for l in err.splitlines())} step lines on stderr")
    if rc != 0:
        fail(f"mpiexec exited {rc}:\n{err}")
    if redraws < 20 or "step 20/20" not in text or " MFU " not in text or " MiB " not in text \
            or "ETA" not in text:
        fail(f"the live line did not reach the controlling terminal:\n{text[-2000:]!r}\n{err}")
    if any(l.startswith("step ") for l in err.splitlines()) or "== fsc-train summary" not in err \
            or "fsc-train: GPT L2 C64" not in err:
        fail(f"stderr should hold the header and summary but no step lines:\n{err}")
    last = text.rsplit("\r\x1b[K", 1)[-1].strip()
    print("   " + last)
    text, err, rc = mpirun_in_pty("--progress", "plain")
    plain = [l for l in err.splitlines() if l.startswith("step ")]
    if rc != 0 or "step " in text or not plain or plain[-1].split()[1] != "20/20":
        fail(f"--progress plain: expected lines on stderr only:\nterminal {text!r}\n{err}")
    print(f"ok  --progress plain: {len(plain)} lines on stderr, none on the terminal")


if __name__ == "__main__":
    pipe_under_mpirun()
    pty_single()
    tty_under_mpirun()
