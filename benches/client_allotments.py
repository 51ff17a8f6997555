#!/usr/bin/env python3
"""Allotments decided inside apps (issue 23) against exact forwarding and
Redis + Lua, for one hot key offered 10x its limit.

Three `sluice serve` processes (pinned to core 0) and three app processes,
each a `sluice bench --target client` (the sluice-client library, as an
app links it; pinned to core 1) sending one token-bucket key to its own
node, open loop, together 10x the limit:

- allotments: `--mode tiered`: each app decides in process on what its
  node passes on, and asks the node when that runs out;
- exact: every decision by the key's owner (two apps of three forwarded);
- redis: the same three apps as `sluice bench --target redis` against one
  redis-server running the token-bucket Lua script (EVALSHA), core 0.

Reported per mode: decisions per server CPU-second (the node processes',
or redis-server's, from /proc/<pid>/stat), admissions against the exact
token bucket (burst once, then the rate: DESIGN §7), the share decided in
the apps, and the apps' in-process decision p99. Then an uneven run
(80/10/10 of the demand) for the busy app's share of the admissions.

Usage: benches/client_allotments.py [--seconds 5] [--limit 1000]
(needs target/release/sluice, and redis-server: installed if missing)
"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from cluster import BIN, Cluster  # noqa: E402
from redis import Redis, ensure_redis  # noqa: E402


def apps(targets, mode, limit, rates, seconds, name):
    """Start one app per (target address, rate); their summaries, and the
    span they covered (the longest run plus the spread of their starts)."""
    procs = []
    started = time.time()
    for (target, addr), rate in zip(targets, rates):
        cmd = ["taskset", "-c", "1", BIN, "bench", "--json", "--target", target,
               "--addr", addr, "--name", name, "--dist", "hot", "--keys", "1",
               "--limit", str(limit), "--duration-ms", "1000", "--concurrency", "64",
               "--duration", f"{seconds}s", "--rate", str(rate)]
        if mode == "allotments":
            cmd += ["--mode", "tiered"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
    spread = time.time() - started
    runs = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            sys.exit(f"sluice bench failed: {p.returncode}")
        runs.append(json.loads(out.strip().splitlines()[-1]))
    return runs, max(r["seconds"] for r in runs) + spread


def summarize(mode, runs, span, limit, cpu):
    decisions = sum(r["decisions"] for r in runs)
    admitted = sum(r["admitted"] for r in runs)
    exact = limit * (1 + span)
    in_process = sum(r.get("client", {}).get("in_process_admitted", 0)
                     + r.get("client", {}).get("in_process_refused", 0) for r in runs)
    p99 = max(r.get("client", {}).get("in_process_ns", {}).get("p99", 0) for r in runs)
    return {
        "mode": mode,
        "decisions": decisions,
        "decisions_per_s": decisions / span,
        "server_cpu_s": cpu,
        "decisions_per_server_cpu_s": decisions / max(cpu, 1e-9),
        "admitted": admitted,
        "exact": round(exact),
        "over_admission_pct": 100.0 * (admitted / exact - 1),
        "in_process_pct": 100.0 * in_process / max(decisions, 1),
        "in_process_p99_ns": p99,
        "unavailable": sum(r["unavailable"] + r["errors"] for r in runs),
        "admitted_per_app": [r["admitted"] for r in runs],
    }


def sluice_run(mode, limit, rates, seconds, name):
    cluster = Cluster(3)
    try:
        targets = [("client", addr) for addr in cluster.grpc]
        before = cluster.cpu()
        runs, span = apps(targets, mode, limit, rates, seconds, name)
        return summarize(mode, runs, span, limit, cluster.cpu() - before)
    finally:
        cluster.stop()


def redis_run(limit, rates, seconds, name):
    ensure_redis()
    redis = Redis()
    try:
        targets = [("redis", redis.addr)] * 3
        before = redis.cpu()
        runs, span = apps(targets, "redis", limit, rates, seconds, name)
        return summarize("redis", runs, span, limit, redis.cpu() - before)
    finally:
        redis.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--limit", type=int, default=1000)
    args = ap.parse_args()
    even = [10 * args.limit // 3] * 3
    results = {}
    for mode in ("allotments", "exact", "redis"):
        if mode == "redis":
            r = redis_run(args.limit, even, args.seconds, f"even-{mode}")
        else:
            r = sluice_run(mode, args.limit, even, args.seconds, f"even-{mode}")
        results[mode] = r
        print(json.dumps(r), flush=True)
    uneven = [8 * args.limit, args.limit, args.limit]
    u = sluice_run("allotments", args.limit, uneven, args.seconds, "uneven")
    share = u["admitted_per_app"][0] / max(u["admitted"], 1)
    print(json.dumps(u), flush=True)
    a, e, r = results["allotments"], results["exact"], results["redis"]
    print(f"decisions per server CPU-second: allotments {a['decisions_per_server_cpu_s']:.0f}, "
          f"exact {e['decisions_per_server_cpu_s']:.0f}, redis {r['decisions_per_server_cpu_s']:.0f}: "
          f"{a['decisions_per_server_cpu_s'] / e['decisions_per_server_cpu_s']:.1f}x exact, "
          f"{a['decisions_per_server_cpu_s'] / r['decisions_per_server_cpu_s']:.1f}x redis")
    print(f"over-admission vs the exact bucket: allotments {a['over_admission_pct']:+.1f}%, "
          f"exact {e['over_admission_pct']:+.1f}%, redis {r['over_admission_pct']:+.1f}%; "
          f"uneven {u['over_admission_pct']:+.1f}%")
    print(f"decided in the apps: {a['in_process_pct']:.1f}%; in-process p99 "
          f"{a['in_process_p99_ns'] / 1000:.1f} us")
    print(f"busy app (80% of the demand): {100 * share:.1f}% of the admissions")


if __name__ == "__main__":
    main()
