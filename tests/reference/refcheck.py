"""What the cross-checks of fsc against PyTorch re-derivations share
(adascale_ref.py, slowmo_ref.py): the command line, torch or a skip, the
worst element of a comparison against a bound, one verdict line per
comparison, and the exit status.

The scripts import it from their own folder, which Python puts first on
sys.path whatever the working directory, so ctest finds it from any build
directory.
"""
import math
import sys

SKIP = 77  # the tests' SKIP_RETURN_CODE in tests/CMakeLists.txt


def arguments(prog, *names):
    """The command line's arguments, one per name; else the usage, exit 2."""
    if len(sys.argv) != len(names) + 1:
        print(f"usage: {prog} {' '.join(names)}", file=sys.stderr)
        sys.exit(2)
    return sys.argv[1:]


def torch_or_skip(prog):
    """The torch module; without it, a line saying so and exit 77 (skipped)."""
    try:
        import torch
    except ImportError:
        print(f"{prog}: torch is not installed; skipped")
        sys.exit(SKIP)
    return torch


def worst_ratio(got, want, bound):
    """The largest |got - want| / bound over all elements, in float64, and
    its index (one per dimension; -1s where there is no such element).
    got, want, bound: one shape, as tensors or nested lists. Shapes that
    differ (a side that stopped early) and NaN count as infinitely far, so
    they can never pass."""
    import torch

    got, want, bound = (torch.as_tensor(x, dtype=torch.float64) for x in (got, want, bound))
    nowhere = tuple(-1 for _ in want.shape)
    if got.shape != want.shape:
        return math.inf, nowhere
    r = torch.nan_to_num((got - want).abs() / bound, nan=math.inf)
    if r.numel() == 0:
        return 0.0, nowhere
    flat = int(r.reshape(-1).argmax())
    ratio, index = float(r.reshape(-1)[flat]), []
    for n in reversed(r.shape):
        flat, i = divmod(flat, n)
        index.append(i)
    return ratio, tuple(reversed(index))


def report(line, ratio, must_fail=False):
    """Prints line and its verdict; returns 1 when the verdict is a failure.
    Within the bound (ratio <= 1) is 'ok', else 'FAIL'; a deliberately wrong
    reference (must_fail) has to be outside it: 'caught', else 'NOT CAUGHT'."""
    if must_fail:
        ok = ratio > 1.0
        print(f"{line} {'caught' if ok else 'NOT CAUGHT'}")
    else:
        ok = ratio <= 1.0
        print(f"{line} {'ok' if ok else 'FAIL'}")
    return int(not ok)


def exit_status(prog, failed, what):
    """0 when nothing failed; else 1, after a line '<prog>: <failed> <what>'."""
    if failed:
        print(f"{prog}: {failed} {what}")
        return 1
    return 0
