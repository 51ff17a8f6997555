#!/usr/bin/env python3
"""What a 3-node cluster costs with no load at all: server CPU per second
and wakeups per second of each of node 0's threads (voluntary context
switches, from /proc/<pid>/task/*/status). On a VM each wakeup costs tens
of microseconds, so the count is what the idle CPU follows.

Usage: benches/idle.py [--seconds 10] [--settle 3]  (needs target/release/sluice)
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from cluster import Cluster  # noqa: E402


def wakeups(pid):
    """{thread name: voluntary context switches} of `pid`'s threads (the
    two runtime workers summed under one name)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            status = open(f"/proc/{pid}/task/{tid}/status").read()
        except FileNotFoundError:
            continue  # a thread that ended meanwhile
        n = next(int(line.split()[1]) for line in status.splitlines()
                 if line.startswith("voluntary_ctxt_switches"))
        out[name] = out.get(name, 0) + n
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--settle", type=float, default=3)
    args = ap.parse_args()
    cluster = Cluster(3)
    try:
        time.sleep(args.settle)
        pid = cluster.procs[0].pid
        w0, c0 = wakeups(pid), cluster.cpu()
        time.sleep(args.seconds)
        w1, c1 = wakeups(pid), cluster.cpu()
    finally:
        cluster.stop()
    print(f"three idle nodes: {1000 * (c1 - c0) / args.seconds:.1f} ms of CPU per second")
    for name in sorted(w1):
        rate = (w1[name] - w0.get(name, 0)) / args.seconds
        print(f"node 0, {name}: {rate:.1f} wakeups/s")


if __name__ == "__main__":
    main()
