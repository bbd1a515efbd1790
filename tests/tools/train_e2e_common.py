"""What the fsc-train end-to-end scripts (train_e2e.py and its train_e2e_*.py
modules) share: the binary under test (argv[1]), one scratch directory per run, a
tiny model's flags, and running fsc-train alone or under mpiexec."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import saved_state  # noqa: E402 (beside this file)

FSC_TRAIN = sys.argv[1]
TMP = tempfile.mkdtemp(prefix="fsc-e2e-")
TINY = ["--layers", "2", "--d-model", "64", "--heads", "4", "--seq", "32", "--batch", "4"]


def run(*args, expect_ok=True):
    p = subprocess.run([FSC_TRAIN, *map(str, args)], capture_output=True, text=True, timeout=600)
    if p.returncode < 0:
        sys.exit(f"FAIL: fsc-train {' '.join(map(str, args))} crashed with signal {-p.returncode}")
    if expect_ok and p.returncode != 0:
        sys.exit(f"FAIL: fsc-train {' '.join(map(str, args))} exited {p.returncode}:\n{p.stderr}")
    return p


def fsc_line(p):
    """The first line of a finished run's stderr that fsc-train wrote (its
    message, for the log), or "" when there is none."""
    return next((x for x in p.stderr.splitlines() if x.startswith("fsc-train")), "")


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def run_metrics(name, *args, ranks=1):
    """Runs fsc-train with args (on `ranks` ranks under mpiexec when > 1), its per-step metrics
    written to TMP/name; returns that path."""
    path = os.path.join(TMP, name)
    if ranks > 1:
        mpiexec(ranks, *args, "--metrics", path)
    else:
        run(*args, "--metrics", path)
    return path


def same_tree(what, root, before):
    """Exits unless every file under root is as the fingerprint `before` (saved_state.tree)."""
    diff = saved_state.changed(root, before)
    if diff:
        sys.exit(f"FAIL: {what}: files under {root} changed: {diff}")


def verify_checkpoint(ck):
    """The step of ck's `latest` checkpoint once each member matches its state.json."""
    step, problem = saved_state.checkpoint_problem(ck)
    if problem:
        sys.exit(f"FAIL: {problem}")
    return step


def mpiexec(n, *args, expect_ok=True, env=None):
    launcher = os.environ.get("FSC_MPIEXEC", "mpiexec")
    cmd = [launcher, "-n", str(n), "--oversubscribe", FSC_TRAIN, *map(str, args)]
    # a new session: no controlling terminal, so progress lines come on stderr even when the
    # tests run from a terminal (rank 0 would draw its live line on /dev/tty)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env,
                       start_new_session=True)
    if expect_ok and p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}:\n{p.stderr}")
    return p


def expect_refused(p, needle, what):
    """Exits unless the finished run p failed with needle in its stderr; what names the run."""
    if p.returncode == 0 or needle not in p.stderr:
        sys.exit(f"FAIL: {what}: exit {p.returncode}, expected {needle!r} in:\n{p.stderr}")


def expect_torch_losses(what, model, tokens, fsc_eval):
    """Exits unless the PyTorch model (tests/reference/torch_gpt.py, weights loaded) gives
    fsc's losses fsc_eval on the batches of steps 0-2 (batch 4, seq 32), within 1e-5."""
    import torch
    import torch_gpt
    with torch.no_grad():
        torch_eval = [model.loss(*torch_gpt.batch(tokens, s, 0, 0, 4, 1, 1, 32)).item()
                      for s in range(3)]
    rel = max(abs(a - b) / abs(b) for a, b in zip(fsc_eval, torch_eval))
    print(f"{what} in PyTorch: losses {torch_eval} vs fsc {fsc_eval} (rel {rel:.1e})")
    if rel > 1e-5:
        sys.exit(f"FAIL: the {what} gives different losses in PyTorch ({rel:.2e})")


def varied_corpus(name):
    """TMP/name: 20000 varied bytes, the same every run (the PyTorch cross-checks' corpus)."""
    path = os.path.join(TMP, name)
    with open(path, "wb") as f:
        f.write(bytes((i * 7919 + (i // 13) * 31) % 251 for i in range(20000)))
    return path


def import_torch(*modules):
    """torch (on one thread) and the named tests/reference modules, imported; exits 77 (the
    test skips) where PyTorch is not installed."""
    import importlib
    try:
        found = [importlib.import_module(m) for m in ("torch", *modules)]
    except ImportError:
        print("SKIP: PyTorch is not installed (scripts/install-deps.sh installs python3-torch)")
        sys.exit(77)
    found[0].set_num_threads(1)
    return found


def corpus_tokens(torch, path):
    """The bytes of path as a PyTorch int64 tensor of token ids."""
    with open(path, "rb") as f:
        return torch.tensor(list(f.read()), dtype=torch.int64)


def varied_corpus_tokens(torch, name):
    """(TMP/name, its tokens): varied_corpus and the same bytes as PyTorch's token ids, for a
    cross-check that trains fsc-train and the reference on one corpus."""
    path = varied_corpus(name)
    return path, corpus_tokens(torch, path)


def torch_losses_of(torch_gpt, model, opt, tokens, steps, after_step=None, objective=None):
    """Per-step losses of `steps` steps of opt on the PyTorch model, step s on the batch fsc-train
    reads at step s of one process (batch 4, seq 32); after_step runs after each opt.step().
    objective(x, y) gives (what backward runs on, the loss reported) where they differ (an
    auxiliary term added to the objective only); by default both are model.loss(x, y)."""
    out = []
    for s in range(steps):
        x, y = torch_gpt.batch(tokens, s, 0, 0, 4, 1, 1, 32)
        opt.zero_grad()
        if objective:
            obj, loss = objective(x, y)
        else:
            obj = loss = model.loss(x, y)
        obj.backward()
        opt.step()
        if after_step:
            after_step()
        out.append(loss.item())
    return out
