#!/usr/bin/env python3
"""Does forwarding amortize? Items per forward RPC and server CPU per
decision, 1 decision per call, at 16, 64 and 256 callers (issue 20).

One node (every key local) and three (calls round-robin over the nodes,
so two thirds of the keys are forwarded to their owner); each row reads
every node's `sluice_forward_batch_size` histogram and CPU time before and
after the run. A forwarded decision costs the server CPU of both hops:
per forwarded decision = (3-node CPU - local share) / forwarded items,
with the local share priced at the 1-node figure. Servers on core 0, the
generator on core 1 (`taskset`), as the other benches.

Usage: benches/forwarding.py [--seconds 5] [--callers 16,64,256]
Needs target/release/sluice (benches/redis.py builds it).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import Cluster, metric_sum, metrics  # noqa: E402
from redis import bench, ensure_binary  # noqa: E402


def forward_figures(cluster):
    """(forward RPCs, items forwarded in them) so far, over every node."""
    rpcs = items = 0.0
    for http in cluster.http:
        text = metrics(http)
        rpcs += metric_sum(text, "sluice_forward_batch_size_count")
        items += metric_sum(text, "sluice_forward_batch_size_sum")
    return rpcs, items


def run(cluster, seconds, callers):
    before = forward_figures(cluster)
    r = bench("sluice", cluster, seconds, ["--concurrency", str(callers)])
    after = forward_figures(cluster)
    r["forward_rpcs"] = after[0] - before[0]
    r["forwarded"] = after[1] - before[1]
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--callers", default="16,64,256")
    args = ap.parse_args()
    ensure_binary()
    callers = [int(c) for c in args.callers.split(",")]

    def runs(n):
        """{callers: figures} on a fresh cluster of `n` nodes."""
        cluster = Cluster(n)
        try:
            return {c: run(cluster, args.seconds, c) for c in callers}
        finally:
            cluster.stop()

    one, three = runs(1), runs(3)

    print(f"## Forwarding, 1 decision per call ({time.strftime('%Y-%m-%d')}; "
          f"`benches/forwarding.py --seconds {args.seconds} --callers {args.callers}`)")
    print()
    print("| callers | 1 node: decisions/s | µs CPU per decision | 3 nodes: decisions/s "
          "| µs CPU per decision | forwarded | items per forward RPC "
          "| µs CPU per forwarded decision | forwarded ÷ local |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in callers:
        a, b = one[c], three[c]
        local_us = a["server_cpu_s"] * 1e6 / max(a["decisions"], 1)
        all_us = b["server_cpu_s"] * 1e6 / max(b["decisions"], 1)
        fwd = b["forwarded"]
        local_part = (b["decisions"] - fwd) * local_us / 1e6
        fwd_us = (b["server_cpu_s"] - local_part) * 1e6 / max(fwd, 1)
        per_rpc = fwd / max(b["forward_rpcs"], 1)
        print(f"| {c} | {a['decisions_per_s']:,.0f} | {local_us:.1f} "
              f"| {b['decisions_per_s']:,.0f} | {all_us:.1f} | {fwd / max(b['decisions'], 1):.0%} "
              f"| {per_rpc:.2f} | {fwd_us:.1f} | {fwd_us / local_us:.2f}× |")


if __name__ == "__main__":
    main()
