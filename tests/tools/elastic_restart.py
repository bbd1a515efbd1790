#!/usr/bin/env python3
"""fsc-run's elastic restart (issue 29, item 3), the ctest elastic_restart:

    elastic_restart.py FSC_RUN FSC_TRAIN

fsc-train runs under fsc-run on 4 ranks (ddp, a checkpoint every 2 steps);
rank 3 is killed with SIGKILL before step 6 (FSC_FAULT kill@3:6, fsc-train's
own kill helper). The survivors must end with the lost-rank verdict and
exit status 69 (FSC_DIST_LOST_EXIT; recorded per rank by a wrapper), fsc-run
must restart once on 2 ranks (3 survivors cannot split the global batch of
16) from the checkpoint of step 4 and append one restart line to the
metrics, and the run must finish. Its losses after the restart must equal,
bit for bit, those of a run resumed by hand on 2 ranks from a copy of that
checkpoint. With --max-restarts 0 the same kill ends fsc-run with 69 and no
restart. Prints the restart time: from the last step before the kill to the
first step after the restart, at FSC_TIMEOUT_S=3. Skips (77) where the
launcher cannot keep survivors alive.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

FSC_RUN, FSC_TRAIN = sys.argv[1], sys.argv[2]
TMP = tempfile.mkdtemp(prefix="fsc-elastic-")
TINY = ["--layers", "2", "--d-model", "64", "--heads", "4", "--seq", "32", "--batch", "4",
        "--strategy", "ddp", "--steps", "10", "--save-every", "2", "--quiet"]
# a wrapper that records each rank's exit status, so the distinct status is checked
WRAP = os.path.join(TMP, "wrap.sh")
with open(WRAP, "w") as f:
    f.write('#!/bin/sh\n"$@"\ns=$?\n'
            'echo $s > "$FSC_ELASTIC_DIR/status-${OMPI_COMM_WORLD_RANK:-$PMI_RANK}-$$"\nexit $s\n')
os.chmod(WRAP, 0o755)


def rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def elastic(tag, max_restarts):
    ck, metrics = os.path.join(TMP, f"ck-{tag}"), os.path.join(TMP, f"m-{tag}.jsonl")
    status_dir = os.path.join(TMP, f"status-{tag}")
    os.mkdir(status_dir)
    env = dict(os.environ, FSC_TIMEOUT_S="3", FSC_FAULT="kill@3:6", FSC_ELASTIC_DIR=status_dir)
    p = subprocess.run([sys.executable, FSC_RUN, "--max-restarts", str(max_restarts), "-n", "4",
                        WRAP, FSC_TRAIN, *TINY, "--checkpoint-dir", ck, "--metrics", metrics],
                       capture_output=True, text=True, timeout=240, env=env,
                       start_new_session=True)
    statuses = {}
    for name in glob.glob(os.path.join(status_dir, "status-*")):
        rank = int(os.path.basename(name).split("-")[1])
        statuses.setdefault(rank, []).append(int(open(name).read()))
    return p, ck, metrics, statuses


def main():
    v = subprocess.run([os.environ.get("FSC_MPIEXEC", "mpiexec"), "--version"],
                       capture_output=True, text=True)
    if not any(k in v.stdout + v.stderr for k in ("Open MPI", "OpenRTE", "HYDRA", "hydra")):
        print("skip: the launcher cannot keep survivors alive after a rank dies")
        return 77
    # no restarts left: the verdict's status comes through
    p, _, metrics, statuses = elastic("norestart", 0)
    if p.returncode != 69 or "world rank 3 is lost" not in p.stderr:
        sys.exit(f"FAIL: --max-restarts 0: exit {p.returncode} (want 69):\n{p.stderr[-3000:]}")
    if any(r.get("event") == "restart" for r in rows(metrics)):
        sys.exit("FAIL: --max-restarts 0 wrote a restart line")
    # one restart
    p, ck, metrics, statuses = elastic("once", 1)
    if p.returncode != 0:
        sys.exit(f"FAIL: fsc-run exited {p.returncode}:\n{p.stderr[-4000:]}")
    # ranks 0-2 of the first job exit 69 (the verdict), 0 and 1 of the second 0
    if not all(69 in statuses.get(r, []) for r in (0, 1, 2)) or \
            not all(0 in statuses.get(r, []) for r in (0, 1)) or 69 in statuses.get(3, []):
        sys.exit(f"FAIL: exit statuses by rank {statuses}: want 69 on the first job's survivors "
                 "(ranks 0-2) and 0 on the second job's ranks 0-1")
    got = rows(metrics)
    restarts = [i for i, r in enumerate(got) if r.get("event") == "restart"]
    if len(restarts) != 1:
        sys.exit(f"FAIL: {len(restarts)} restart lines in {metrics}")
    line = got[restarts[0]]
    if line["lost_ranks"] != [3] or line["ranks"] != 2 or line["from_step"] != 4:
        sys.exit(f"FAIL: restart line {line}: want lost [3], 2 ranks, from step 4")
    before, after = got[:restarts[0]], got[restarts[0] + 1:]
    if [r["step"] for r in after] != list(range(5, 11)):
        sys.exit(f"FAIL: steps after the restart: {[r['step'] for r in after]}")
    # the same checkpoint resumed by hand on 2 ranks, global batch kept
    ref = os.path.join(TMP, "ck-ref")
    os.mkdir(ref)
    shutil.copytree(os.path.join(ck, "step-000004"), os.path.join(ref, "step-000004"))
    with open(os.path.join(ref, "latest"), "w") as f:
        f.write("step-000004\n")
    ref_metrics = os.path.join(TMP, "m-ref.jsonl")
    launcher = os.environ.get("FSC_MPIEXEC", "mpiexec")
    extra = ["--oversubscribe"] if "Open MPI" in v.stdout + v.stderr or "OpenRTE" in v.stdout else []
    args = [a for a in TINY]
    args[args.index("--batch") + 1] = "8"
    r = subprocess.run([launcher, "-n", "2", *extra, FSC_TRAIN, *args, "--resume", ref,
                        "--checkpoint-dir", ref, "--metrics", ref_metrics],
                       capture_output=True, text=True, timeout=240, start_new_session=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: the reference resume exited {r.returncode}:\n{r.stderr[-3000:]}")
    want = [(x["step"], x["loss"]) for x in rows(ref_metrics)]
    have = [(x["step"], x["loss"]) for x in after]
    if have != want:
        sys.exit(f"FAIL: losses after the restart {have}\n  resumed by hand on 2 ranks {want}")
    down = after[0]["time"] - max(x["time"] for x in before)
    print(f"elastic restart: rank 3 of 4 killed before step 6; restarted on 2 ranks from step 4, "
          f"losses of steps 5-10 = the hand-resumed run's ({', '.join(f'{l:.6f}' for _, l in have)})"
          f"; {down:.1f} s from the last step before the kill to the first after the restart "
          f"(FSC_TIMEOUT_S=3)")
    shutil.rmtree(TMP, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
