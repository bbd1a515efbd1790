"""fsc-train --profile end to end: a tiny GPT under ddp on 2 ranks writes one
Chrome trace. It must be valid JSON with both ranks in it, every rank's spans
properly nested (a span lies inside the one enclosing its start, or starts
after it ends), and the per-category self times read back from the spans must
add up to the steps' time within 5% and agree with the totals the tool printed
into the file. argv: fsc-train."""
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict

FSC_TRAIN = sys.argv[1]
TMP = tempfile.mkdtemp(prefix="fsc-profile-")
TINY = ["--layers", "2", "--d-model", "64", "--heads", "4", "--seq", "32", "--batch", "4"]
RANKS = 2


def fail(msg):
    sys.exit(f"FAIL: {msg}")


def nested(spans):
    """None when the spans (start, end, name) of one thread nest; else the first pair that cross."""
    stack = []
    for t0, t1, name in sorted(spans, key=lambda s: (s[0], -s[1])):
        while stack and t0 >= stack[-1][1]:
            stack.pop()
        if stack and t1 > stack[-1][1]:
            return f"{name} [{t0}, {t1}] crosses {stack[-1][2]} [{stack[-1][0]}, {stack[-1][1]}]"
        stack.append((t0, t1, name))
    return None


def self_times(spans):
    """Self time (ns) by category of the spans inside step spans, and the steps' total."""
    cats, step_ns = defaultdict(int), 0
    order = sorted(spans, key=lambda s: (s[0], -s[1]))
    stack = []  # [t0, t1, cat, children_ns, in_step]

    def close(top):
        if top[4]:
            cats["other" if top[2] == "step" else top[2]] += (top[1] - top[0]) - top[3]

    for t0, t1, cat in order:
        while stack and t0 >= stack[-1][1]:
            close(stack.pop())
        if stack:
            stack[-1][3] += t1 - t0
        in_step = cat == "step" or bool(stack and stack[-1][4])
        if cat == "step":
            step_ns += t1 - t0
        stack.append([t0, t1, cat, 0, in_step])
    while stack:
        close(stack.pop())
    return cats, step_ns


def main():
    path = os.path.join(TMP, "profile.json")
    launcher = os.environ.get("FSC_MPIEXEC", "mpiexec")
    cmd = [launcher, "-n", str(RANKS), "--oversubscribe", FSC_TRAIN, *TINY, "--strategy", "ddp",
           "--steps", "3", "--grad-accum", "2", "--profile", path]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, start_new_session=True)
    if p.returncode != 0:
        fail(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr}")
    for needle in ("| category |", "top 15 ops by self time", "per-module activation memory"):
        if needle not in p.stdout:
            fail(f"the summary lacks {needle!r}:\n{p.stdout}")
    try:
        with open(path) as f:
            trace = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path} is not a JSON trace: {e}")
    events = trace["traceEvents"]
    spans = defaultdict(list)  # (pid, tid) -> (start ns, end ns, name/cat)
    names = defaultdict(set)
    for e in events:
        if e.get("ph") == "X":
            t0 = round(e["ts"] * 1000)
            spans[(e["pid"], e["tid"])].append((t0, t0 + round(e["dur"] * 1000), e["name"], e["cat"]))
            names[e["pid"]].add(e["name"].split(" ")[0])
    pids = sorted({pid for pid, _ in spans})
    if pids != list(range(RANKS)):
        fail(f"ranks in the trace: {pids}, expected 0..{RANKS - 1}")
    meta = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    if meta != set(range(RANKS)):
        fail(f"process names for ranks {sorted(meta)}")
    if not any(e.get("ph") == "C" and e.get("name") == "arena bytes" for e in events):
        fail("no 'arena bytes' counter in the trace")
    totals = {r["rank"]: r for r in trace["fscProfile"]["ranks"]}
    for pid in pids:
        for want in ("step", "micro-batch", "sgemm", "TransformerBlock", "LayerNorm",
                     "cross_entropy", "optimizer", "allreduce"):
            if want not in names[pid]:
                fail(f"rank {pid}: no {want!r} span (have {sorted(names[pid])})")
        for key, sp in spans.items():
            if key[0] != pid:
                continue
            problem = nested([(a, b, n) for a, b, n, _ in sp])
            if problem:
                fail(f"rank {pid} thread {key[1]}: spans do not nest: {problem}")
        cats, step_ns = self_times([(a, b, c) for (q, _), sp in spans.items() if q == pid
                                    for a, b, _, c in sp])
        steps = sum(1 for (q, _), sp in spans.items() if q == pid for *_, c in sp if c == "step")
        if steps != 3:
            fail(f"rank {pid}: {steps} step spans, expected 3")
        total = sum(cats.values())
        print(f"rank {pid}: steps {step_ns / 1e6:.2f} ms, categories add to {total / 1e6:.2f} ms: "
              + ", ".join(f"{c} {v / 1e6:.2f}" for c, v in sorted(cats.items())))
        if abs(total - step_ns) > 0.05 * step_ns:
            fail(f"rank {pid}: categories add to {total} ns, the steps take {step_ns} ns")
        printed = totals[pid]
        if abs(printed["step_s"] * 1e9 - step_ns) > 0.05 * step_ns:
            fail(f"rank {pid}: the summary's step time {printed['step_s']} s vs {step_ns} ns traced")
        for cat, secs in printed["category_s"].items():
            if abs(secs * 1e9 - cats.get(cat, 0)) > 0.05 * step_ns:
                fail(f"rank {pid}: {cat}: summary {secs * 1e3:.3f} ms, trace "
                     f"{cats.get(cat, 0) / 1e6:.3f} ms")
    print("profile trace: valid JSON, both ranks, spans nested, categories = step time")


main()
