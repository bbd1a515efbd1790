#!/usr/bin/env python3
"""Two hosts on one machine (issue 29, item 5), the ctest multihost (label
multihost):

    multihost.py MPIEXEC TEST_PROGRAM...

Builds two network namespaces joined by a veth pair, with addresses of the
project's own (10.77.29.1 and 10.77.29.2 on a /24 that exists only inside
the two namespaces), and runs each test program on 4 ranks across them
under Open MPI: a hostfile of 2 slots per "host", the TCP transport only
(`--mca btl tcp,self`: no shared memory, even between ranks of one
namespace), and no ssh: the launcher reaches the second namespace through
a plm_rsh_agent script that runs orted there with `ip netns exec`. Each
program must pass (mpi_trainer: ddp, fsdp and every row = one process;
mpi_mesh: pp 2 x tp 2 = one process; mpi_hsdp: 2 shard groups, one per
host). The namespaces and the link are removed at the end, whatever
happened. Skips (77) with the reason where namespaces cannot be made (not
root, no `ip`, a kernel or container that refuses them) or the launcher
is not Open MPI's.
"""
import os
import shutil
import subprocess
import sys
import tempfile

NET, A_IP, B_IP = "10.77.29.0/24", "10.77.29.1", "10.77.29.2"


def sh(*cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def skip(why):
    print(f"skip: multihost: {why}")
    sys.exit(77)


def main():
    mpiexec, programs = sys.argv[1], sys.argv[2:]
    v = sh(mpiexec, "--version")
    if "Open MPI" not in v.stdout + v.stderr and "OpenRTE" not in v.stdout + v.stderr:
        skip("the launcher is not Open MPI's (the hostfile and agent below are its)")
    if not shutil.which("ip"):
        skip("no `ip` (iproute2) to make network namespaces")
    tag = str(os.getpid())
    a, b, va, vb = f"fscmh_a{tag}", f"fscmh_b{tag}", f"fmha{tag}", f"fmhb{tag}"
    made = sh("ip", "netns", "add", a)
    if made.returncode != 0:
        skip(f"cannot make a network namespace here (`ip netns add`: {made.stderr.strip()}); "
             "it needs root or CAP_SYS_ADMIN")
    tmp = tempfile.mkdtemp(prefix="fsc-multihost-")
    try:
        steps = [("ip", "netns", "add", b),
                 ("ip", "link", "add", va, "type", "veth", "peer", "name", vb),
                 ("ip", "link", "set", va, "netns", a), ("ip", "link", "set", vb, "netns", b),
                 ("ip", "-n", a, "addr", "add", f"{A_IP}/24", "dev", va),
                 ("ip", "-n", b, "addr", "add", f"{B_IP}/24", "dev", vb),
                 ("ip", "-n", a, "link", "set", "lo", "up"),
                 ("ip", "-n", b, "link", "set", "lo", "up"),
                 ("ip", "-n", a, "link", "set", va, "up"), ("ip", "-n", b, "link", "set", vb, "up")]
        for s in steps:
            r = sh(*s)
            if r.returncode != 0:
                skip(f"`{' '.join(s)}` failed: {r.stderr.strip()}")
        agent = os.path.join(tmp, "agent.sh")
        with open(agent, "w") as f:  # "agent [ssh options] HOST COMMAND..." in HOST's namespace
            f.write("#!/bin/sh\n"
                    'while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done\n'
                    'host=$1; shift\n'
                    f'case "$host" in {A_IP}) ns={a};; {B_IP}) ns={b};; '
                    '*) echo "agent: unknown host $host" >&2; exit 1;; esac\n'
                    'exec ip netns exec "$ns" /bin/sh -c "$*"\n')
        os.chmod(agent, 0o755)
        hosts = os.path.join(tmp, "hosts")
        with open(hosts, "w") as f:
            f.write(f"{A_IP} slots=2\n{B_IP} slots=2\n")
        env = dict(os.environ, FSC_TIMEOUT_S="60")
        failed = []
        for prog in programs:
            cmd = ["ip", "netns", "exec", a, mpiexec, "--hostfile", hosts, "-n", "4",
                   "--mca", "plm_rsh_agent", agent, "--mca", "btl", "tcp,self",
                   "--mca", "btl_tcp_if_include", NET, "--mca", "oob_tcp_if_include", NET, prog]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
            name = os.path.basename(prog)
            if r.returncode != 0:
                failed.append(name)
                print(f"FAIL: {name} across two namespaces exited {r.returncode}:\n"
                      f"{(r.stdout + r.stderr)[-4000:]}")
            else:
                print(f"{name}: passed on 4 ranks, 2 per namespace, TCP only")
        return 1 if failed else 0
    finally:
        sh("ip", "netns", "del", a)
        sh("ip", "netns", "del", b)  # the veth pair goes with them
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
