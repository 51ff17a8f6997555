#!/usr/bin/env python3
"""Sluice and Redis + Lua over the same transport, in one run: each over
loopback TCP and over its Unix socket (Sluice's `grpc_uds`, Redis's
`unixsocket`) — the node-local path a DaemonSet's pods use.

Same generator, keys, limit, pinning and accounting as benches/redis.py
(decisions per *server* CPU-second from /proc; targets alternate A B C D,
best of --reps). Prints a table for benches/README.md.

Usage: benches/uds.py [--seconds 5] [--reps 3]
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import Cluster  # noqa: E402
from redis import Redis, bench, ensure_binary, ensure_redis, flag  # noqa: E402


class Via:
    """A started server reached at other addresses (its Unix socket)."""

    def __init__(self, server, grpc=None, addr=None):
        self.server, self.grpc, self.addr = server, grpc, addr

    def cpu(self):
        return self.server.cpu()

    def check_durations(self):
        return self.server.check_durations()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    ensure_redis()
    ensure_binary()
    tmp = tempfile.mkdtemp(prefix="sluice-uds-bench-")
    sluice_sock, redis_sock = os.path.join(tmp, "sluice.sock"), os.path.join(tmp, "redis.sock")
    one = Cluster(1, extra=["--grpc-uds", sluice_sock])
    redis = Redis(unixsocket=redis_sock)
    targets = {
        "sluice tcp": one,
        "sluice uds": Via(one, grpc=[f"unix:{sluice_sock}"]),
        "redis tcp": redis,
        "redis uds": Via(redis, addr=f"unix:{redis_sock}"),
    }
    rows = {}
    try:
        for name, extra in [
            ("1 per call, 16 callers", ["--concurrency", "16"]),
            ("1 per call, 64 callers", ["--concurrency", "64"]),
            ("batch 100 (Redis: pipeline 100), 16 callers",
             ["--concurrency", "16", "--items", "100"]),
        ]:
            runs = {}
            for _ in range(args.reps):
                for label, server in targets.items():
                    kind = "redis" if label.startswith("redis") else "sluice"
                    r = bench(kind, server, args.seconds, extra)
                    if label not in runs or r["per_cpu_s"] > runs[label]["per_cpu_s"]:
                        runs[label] = r
            rows[name] = runs
    finally:
        one.stop()
        redis.stop()
    print(f"\nbenches/uds.py --seconds {args.seconds} --reps {args.reps}\n")
    print("| mode | transport | Sluice decisions / server CPU-s | Redis + Lua | Sluice ÷ Redis |")
    print("|---|---|---|---|---|")
    for name, runs in rows.items():
        for t in ("tcp", "uds"):
            s, r = runs[f"sluice {t}"], runs[f"redis {t}"]
            print(f"| {name} | {t} | {s['per_cpu_s']:,.0f}{flag(s)} | {r['per_cpu_s']:,.0f}{flag(r)}"
                  f" | {s['per_cpu_s'] / r['per_cpu_s']:.2f}× |")
        s_gain = runs["sluice uds"]["per_cpu_s"] / runs["sluice tcp"]["per_cpu_s"]
        r_gain = runs["redis uds"]["per_cpu_s"] / runs["redis tcp"]["per_cpu_s"]
        print(f"| {name} | uds ÷ tcp | {s_gain:.2f}× | {r_gain:.2f}× | |")


if __name__ == "__main__":
    main()
