#!/usr/bin/env python3
"""Two builds of the load generator (`sluice bench`) against the same server,
open loop: does the latency measure the server, or the generator's own core?

One Sluice node (this build) and one Redis on core 0, the generator on core
1, as benches/redis.py runs them. Redis's closed-loop peak at 64 callers
sets the rates (10, 25, 50 and 75% of it); at each rate the two generators
alternate, A B A B, for `--reps` runs each, against the Sluice node. For
each run: the client's latency percentiles (from each call's intended
start), the generator's own delay in starting a call (the new generator
reports it; the old one cannot), the generator's and the server's core
share, and the server's own `Check` p99 from its histogram — the figure
that does not depend on the generator at all.

Usage: benches/generator.py --baseline PATH [--seconds 4] [--reps 2]
(PATH: another build's `sluice`, e.g. the commit before a generator change;
needs target/release/sluice and redis-server, as benches/redis.py does.)
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import BIN, Cluster, quantile  # noqa: E402
from redis import KEYS, LIMIT, Redis, ensure_redis  # noqa: E402


def run(gen, addr, seconds, extra, server=None, target=None):
    """One open- or closed-loop run of generator `gen`; its summary, with
    core shares and (for a Sluice `server`) the server's own Check p99."""
    tgt = ["--target", target] if target else []
    cmd = ["taskset", "-c", "1", gen, "bench", "--json", "--duration", f"{seconds}s",
           "--keys", KEYS, *LIMIT, "--addr", addr, *tgt, *extra]
    durations = server.check_durations() if server else None
    cpu = server.cpu() if server else 0.0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = json.loads(out.stdout)
    secs = max(r["seconds"], 1e-9)
    r["gen_share"] = (after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime) / secs
    if server:
        r["server_share"] = (server.cpu() - cpu) / secs
        p99 = quantile(durations, server.check_durations(), 0.99)
        r["server_p99_us"] = None if p99 is None else round(p99[0] * 1e6)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", required=True, help="the other generator's sluice binary")
    ap.add_argument("--seconds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    ensure_redis()
    gens = {"baseline": args.baseline, "this build": BIN}
    redis, node = Redis(), Cluster(1)
    rows = []
    try:
        peak = run(BIN, redis.addr, args.seconds, ["--concurrency", "64"],
                   target="redis")["calls_per_s"]
        for share in (0.1, 0.25, 0.5, 0.75):
            rate = str(round(peak * share))
            for rep in range(args.reps):
                for name, gen in gens.items():
                    r = run(gen, node.grpc[0], args.seconds,
                            ["--rate", rate, "--concurrency", "256"], server=node)
                    rows.append((share, name, rep, r))
    finally:
        node.stop()
        redis.stop()
    print(f"## Generator A/B ({time.strftime('%Y-%m-%d')}; "
          f"`benches/generator.py --baseline {args.baseline} --seconds {args.seconds} "
          f"--reps {args.reps}`)")
    print(f"\nRedis's peak (64 callers, closed loop): {peak:,.0f} calls/s. "
          "Latency in µs from each call's intended start; 'late' is the generator's "
          "own delay in starting a call; shares are of one core.\n")
    print("| rate | generator | rep | calls/s | p50 | p99 | p99.9 | late p99 | generator core "
          "| server core | server's own Check p99 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for share, name, rep, r in rows:
        lat, late = r["latency_us"], r.get("late_us")
        print(f"| {share:.0%} | {name} | {rep + 1} | {r['calls_per_s']:,.0f} | {lat['p50']} "
              f"| {lat['p99']} | {lat['p999']} | {late['p99'] if late else '–'} "
              f"| {r['gen_share']:.0%} | {r['server_share']:.0%} | {r['server_p99_us']} |")


if __name__ == "__main__":
    main()
