#!/usr/bin/env python3
"""The one-rank pilot rule of docs/benchmarks.md's AdaScale section.

    pilot.py OUTDIR SEED [SEED ...]

Reads OUTDIR/one_SEED.jsonl and says whether the regime may go on to 4
ranks: on every seed the held-out loss falls below 3.0 (off the plateau) by
step 400 and below 2.6 by step 800, with no held-out value above 3.6 after
step 50. Decided on one rank only, so no 4-rank result can steer it. Exits 0
when every seed passes, 1 otherwise (run.sh then stops before any 4-rank run).
"""
import json
import os
import sys

OFF, OFF_BY = 3.0, 400
END, END_BY = 2.6, 800
CEIL, CEIL_AFTER = 3.6, 50


def check(path):
    """Why the run fails the rule, or "" when it passes."""
    with open(path) as f:
        ev = [(r["step"], r["val_loss"]) for r in map(json.loads, filter(str.strip, f))
              if "val_loss" in r]
    if not ev or ev[-1][0] < END_BY:
        return f"no held-out loss at step {END_BY}"
    why = []
    if not any(v < OFF for s, v in ev if s <= OFF_BY):
        why.append(f"not below {OFF} by step {OFF_BY} "
                   f"(min {min(v for s, v in ev if s <= OFF_BY):.3f})")
    if not any(v < END for s, v in ev if s <= END_BY):
        why.append(f"not below {END} by step {END_BY} (last {ev[-1][1]:.3f})")
    high = [(s, v) for s, v in ev if s > CEIL_AFTER and v > CEIL]
    if high:
        why.append(f"{len(high)} held-out values above {CEIL} after step {CEIL_AFTER} "
                   f"(first {high[0][1]:.3f} at step {high[0][0]})")
    return "; ".join(why)


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: pilot.py OUTDIR SEED [SEED ...]")
    out, seeds = sys.argv[1], sys.argv[2:]
    failed = 0
    for seed in seeds:
        path = os.path.join(out, f"one_{seed}.jsonl")
        with open(path) as f:
            ev = [r for r in map(json.loads, filter(str.strip, f)) if "val_loss" in r]
        at = {r["step"]: r["val_loss"] for r in ev}
        why = check(path)
        failed += bool(why)
        high = max((v for s, v in at.items() if s > CEIL_AFTER), default=float("nan"))
        print(f"pilot seed {seed}: step 100 {at.get(100, float('nan')):.3f}, 400 "
              f"{at.get(400, float('nan')):.3f}, 800 {at.get(800, float('nan')):.3f}, "
              f"max after {CEIL_AFTER} {high:.3f}: " + (f"FAILS: {why}" if why else "passes"))
    print(f"pilot rule: {'passes' if not failed else f'fails on {failed} of {len(seeds)} seeds'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
