#!/usr/bin/env python3
"""Cross-check of fsc's AdaScale estimator (fsc/adascale.h) against
FairScale's fairscale.optim.AdaScale, re-derived here in PyTorch from its
documented behaviour (FairScale itself is not a dependency).

Real gradients: a small MLP regression is trained for T steps; each step
draws `world` ranks x `accum` micro-batches, and each micro-batch's gradient
is one sample, taken the way FairScale's backward hook sees it (before the
ranks' average). FairScale's estimator then runs as its documentation and
the paper (Johnson et al. 2020, Appendix B.3) state it:

    local_sqr = sum_i ||g_i||^2 over the cN = world x accum samples
    total_sqr = ||(1/cN) sum_i g_i||^2
    var = local_sqr (S / cN) / (cN - 1) - total_sqr S / (cN - 1), at least 1e-6
    sqr = total_sqr - var / S, at least 0
    averages: debiased EWMA (debias_ewma=True), or the mean of the first
              1 / (1 - smoothing) values then an EWMA (debias_ewma=False);
              smoothing defaults to max(1 - cN / 1000, 0)
    gain = (var_avg + sqr_avg) / (var_avg / S + sqr_avg)
    set_scale(new): the variance average (and what feeds it) times old / new

and the learning rate of each step is gain x the base lr. The gradients are
written for `test_adascale --replay`, which feeds the C estimator the same
samples; the gains after every step must agree within 1e-9 relative (both
sides sum in double; the only difference is summation order).

Usage (ctest runs it; exit 77 when torch is missing):

    /usr/bin/python3 tests/reference/adascale_ref.py build/tests/test_adascale
"""
import os
import struct
import subprocess
import sys
import tempfile

import refcheck

torch = refcheck.torch_or_skip("adascale_ref")

TOL = 1e-9
STEPS = 60


class AdaScaleRef:
    """FairScale's gain estimator for one parameter group."""

    def __init__(self, samples, scale=None, smoothing=None, debias_ewma=True):
        self.samples = samples
        self.scale = float(scale if scale else samples)
        self.smoothing = max(1 - samples / 1000, 0) if smoothing is None else smoothing
        self.debias = debias_ewma
        self.avg = {"sqr": torch.tensor(1.0, dtype=torch.float64),
                    "var": torch.tensor(0.0, dtype=torch.float64)}
        self.biased = {"sqr": 0.0, "var": 0.0}
        self.weight = {"sqr": 0.0, "var": 0.0}
        self.total = {"sqr": None, "var": None}
        self.count = 0
        self.local_sqr = None

    def set_scale(self, scale):
        f = self.scale / scale
        self.biased["var"] *= f
        if self.total["var"] is not None:
            self.total["var"] *= f
        self.avg["var"] = self.avg["var"] * f
        self.scale = float(scale)

    def hook(self, grad):  # one sample, before any reduction
        s = grad.double().pow(2).sum()
        self.local_sqr = s if self.local_sqr is None else self.local_sqr + s

    def final(self, mean_grad):  # after the average over all samples
        n, S = self.samples, self.scale
        total = mean_grad.double().pow(2).sum()
        var = self.local_sqr * (S / n) / (n - 1) - total * S / (n - 1)
        sqr = total - var / S
        var, sqr = torch.clamp(var, min=1e-6), torch.clamp(sqr, min=0.0)
        self.count += 1
        for name, value in (("sqr", sqr), ("var", var)):
            self._average(name, value)
        self.local_sqr = None

    def _average(self, name, value):
        f = self.smoothing
        if self.debias:
            self.biased[name] = f * self.biased[name] + (1 - f) * value
            self.weight[name] = f * self.weight[name] + (1 - f)
            self.avg[name] = self.biased[name] / self.weight[name]
        elif self.count < 1 / (1 - f):
            self.total[name] = value if self.total[name] is None else self.total[name] + value
            self.avg[name] = self.total[name] / self.count
        else:
            self.avg[name] = f * self.avg[name] + (1 - f) * value

    def gain(self):
        var, sqr = self.avg["var"], self.avg["sqr"]
        return float((var + sqr) / (var / self.scale + sqr))


def make_gradients(world, accum, path):
    """Trains the MLP under the default estimator; writes every sample."""
    torch.manual_seed(16)
    teacher = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    params = list(model.parameters())
    n = world * accum
    est = AdaScaleRef(n)
    D = sum(p.numel() for p in params)
    with open(path, "wb") as f:
        f.write(struct.pack("<3i", STEPS, n, D))
        for _ in range(STEPS):
            samples = []
            for _ in range(n):  # rank r, micro-batch k: its own 8 rows
                x = torch.randn(8, 16)
                y = teacher(x).detach() + 0.3 * torch.randn(8, 1)
                model.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                g = torch.cat([p.grad.reshape(-1) for p in params]).detach().float()
                est.hook(g)
                samples.append(g)
            g = torch.stack(samples)
            f.write(g.numpy().astype("<f4").tobytes())
            mean = g.mean(0)
            est.final(mean)
            with torch.no_grad():  # SGD at gain x lr
                off = 0
                for p in params:
                    p -= 0.05 * est.gain() * mean[off:off + p.numel()].reshape(p.shape)
                    off += p.numel()
    return D


def read_samples(path):
    with open(path, "rb") as f:
        T, n, D = struct.unpack("<3i", f.read(12))
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.float32)
    return data.reshape(T, n, D)


# (name, C smoothing: 0 default / -1 none / f, FairScale smoothing, debias,
#  scale (0: samples), switch step, new scale)
CASES = [
    ("default", 0, None, True, 0, 0, 0),
    ("smoothing 0.9, paper average", 0.9, 0.9, False, 0, 0, 0),
    ("no smoothing", -1, 0.0, True, 0, 0, 0),
    ("scale 2 of 4 samples", 0.8, 0.8, True, 2, 0, 0),
    ("scale 8 of 4 samples, default smoothing", 0, None, True, 8, 0, 0),
    ("set_scale 4 -> 8 at step 30", 0.95, 0.95, True, 0, 30, 8),
    ("set_scale 4 -> 2, paper average", 0.9, 0.9, False, 0, 25, 2),
]


def main():
    exe, = refcheck.arguments("adascale_ref.py", "PATH/TO/test_adascale")
    failed = 0
    with tempfile.TemporaryDirectory(prefix="fsc_adascale_ref") as tmp:
        path = os.path.join(tmp, "grads.bin")
        D = make_gradients(world=2, accum=2, path=path)
        g = read_samples(path)
        T, n = g.shape[0], g.shape[1]
        for name, c_smooth, fs_smooth, debias, scale, switch, new_scale in CASES:
            ref = AdaScaleRef(n, scale=scale, smoothing=fs_smooth, debias_ewma=debias)
            want = []
            for t in range(T):
                if t + 1 == switch:
                    ref.set_scale(new_scale)
                for i in range(n):
                    ref.hook(g[t, i])
                ref.final(g[t].double().mean(0))
                want.append(ref.gain())
            out = subprocess.run([exe, "--replay", path, str(scale), str(c_smooth),
                                  "0" if debias else "1", str(switch), str(new_scale)],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                print(f"{name}: test_adascale --replay failed: {out.stderr.strip()}")
                failed += 1
                continue
            have = [float(v) for v in out.stdout.split()]
            worst, _ = refcheck.worst_ratio(have, want, [TOL * abs(w) for w in want])
            failed += refcheck.report(
                f"{name}: {T} steps, {n} samples of {D}, gains {min(want):.4f}..{max(want):.4f},"
                f" last {want[-1]:.6f} (C {have[-1] if have else float('nan'):.6f}),"
                f" worst relative difference {worst * TOL:.2e}", worst)
    return refcheck.exit_status("adascale_ref", failed,
                                f"case(s) differ from FairScale's formulas by more than {TOL}")


if __name__ == "__main__":
    sys.exit(main())
