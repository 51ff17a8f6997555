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
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import BIN, Cluster  # noqa: E402
from redis import Redis, bench, ensure_redis  # noqa: E402


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
        peak = bench("redis", redis, args.seconds, ["--concurrency", "64"])["calls_per_s"]
        for share in (0.1, 0.25, 0.5, 0.75):
            rate = str(round(peak * share))
            for rep in range(args.reps):
                for name, gen in gens.items():
                    r = bench("sluice", node, args.seconds,
                              ["--rate", rate, "--concurrency", "256"], gen=gen)
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
        lat, late, own = r["latency_us"], r.get("late_us"), r["server_check_p99_us"]
        print(f"| {share:.0%} | {name} | {rep + 1} | {r['calls_per_s']:,.0f} | {lat['p50']} "
              f"| {lat['p99']} | {lat['p999']} | {late['p99'] if late else '–'} "
              f"| {r['generator_core_share']:.0%} | {r['server_core_share']:.0%} "
              f"| {own[0] if own else '–'} |")


if __name__ == "__main__":
    main()
