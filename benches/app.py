#!/usr/bin/env python3
"""What an app pays per decision, through its client library: `--tasks`
concurrent tasks in one process (`benches/app.rs`) deciding one key at a
time through sluice-client (one call per check, and batching; each over
`CheckStream`, the client's default, and over unary calls) and through
redis-rs's multiplexed, auto-pipelining connection running the token-bucket
Lua script of `benches/redis.py`. The server on core 0, the app on core 1;
targets alternate A B C A B C; best of the repetitions by decisions per
server CPU-second, with the app's own CPU per decision beside it.

Usage: benches/app.py [--seconds 4] [--reps 3] [--tasks 16,64,256] [--smoke]
Installs redis-server if missing, builds what it runs, stops what it starts.
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import Cluster  # noqa: E402
from redis import ROOT, Redis, ensure_binary, ensure_redis  # noqa: E402

BATCH = 100


def app_binary():
    out = subprocess.run(["cargo", "bench", "--locked", "--bench", "app", "--no-run",
                          "--message-format=json"], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg["target"]["name"] == "app" \
                and msg.get("executable"):
            return msg["executable"]
    sys.exit("cargo did not say where the app bench is")


def run(app, target, addr, pid, tasks, seconds, batching=0, streams=1):
    cmd = ["taskset", "-c", "1", app, "--target", target, "--addr", addr, "--server-pid",
           str(pid), "--tasks", str(tasks), "--seconds", str(seconds), "--batching", str(batching),
           "--streams", str(streams)]
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                  timeout=seconds + 60).stdout)
    r["per_cpu_s"] = r["decisions"] / max(r["server_cpu_s"], 1e-9)
    r["app_us"] = r["app_cpu_s"] / max(r["decisions"], 1) * 1e6
    r["server_share"] = r["server_cpu_s"] / r["seconds"]
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tasks", default="16,64,256")
    ap.add_argument("--smoke", action="store_true",
                    help="CI: fail unless every run decided something and left nothing undecided")
    args = ap.parse_args()
    ensure_redis()
    ensure_binary()
    app = app_binary()
    with contextlib.ExitStack() as running:  # every server started is stopped
        node = Cluster(1)
        running.callback(node.stop)
        redis = Redis()
        running.callback(redis.stop)
        sluice_pid = node.procs[0].pid
        targets = {
            "sluice, 1 call per check, unary": lambda t: run(
                app, "sluice", node.grpc[0], sluice_pid, t, args.seconds, 0, 0),
            "sluice, 1 call per check, stream": lambda t: run(
                app, "sluice", node.grpc[0], sluice_pid, t, args.seconds, 0, 1),
            f"sluice, batching {BATCH}, unary": lambda t: run(
                app, "sluice", node.grpc[0], sluice_pid, t, args.seconds, BATCH, 0),
            f"sluice, batching {BATCH}, stream": lambda t: run(
                app, "sluice", node.grpc[0], sluice_pid, t, args.seconds, BATCH, 1),
            "redis-rs multiplexed": lambda t: run(app, "redis", redis.addr, redis.proc.pid, t,
                                                  args.seconds),
        }
        rows = []
        for tasks in [int(t) for t in args.tasks.split(",")]:
            runs = {name: [] for name in targets}
            for _ in range(args.reps):
                for name, go in targets.items():
                    r = go(tasks)
                    runs[name].append(r)
                    print(f"{tasks} tasks, {name}: {r['per_cpu_s']:,.0f} per server CPU-s, "
                          f"{r['decisions'] / r['seconds']:,.0f}/s, undecided {r['undecided']}",
                          file=sys.stderr)
            rows.append((tasks, {n: max(rs, key=lambda r: r["per_cpu_s"]) for n, rs in runs.items()},
                         runs))
    if args.smoke:
        failed = [f"{tasks} tasks, {name}: {r['decisions']} decided, {r['undecided']} undecided"
                  for tasks, _, runs in rows for name, rs in runs.items() for r in rs
                  if r["decisions"] == 0 or r["undecided"] > 0]
        if failed:
            sys.exit("app bench smoke failed: " + "; ".join(failed))
    print(f"`benches/app.py --seconds {args.seconds:g} --reps {args.reps} --tasks {args.tasks}`\n")
    print("| tasks | client | decisions/s | per server CPU-s (runs) | ÷ redis-rs | server core "
          "| app µs CPU per decision | p50 µs | p99 µs | undecided |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for tasks, best, runs in rows:
        redis_best = best["redis-rs multiplexed"]["per_cpu_s"]
        for name, r in best.items():
            spread = ", ".join(f"{x['per_cpu_s'] / 1e3:.1f}k" for x in runs[name])
            print(f"| {tasks} | {name} | {r['decisions'] / r['seconds']:,.0f} | "
                  f"{r['per_cpu_s']:,.0f} ({spread}) | **{r['per_cpu_s'] / redis_best:.2f}×** | "
                  f"{r['server_share']:.0%} | {r['app_us']:.1f} | {r['p50_us']} | {r['p99_us']} | "
                  f"{r['undecided']} |")


if __name__ == "__main__":
    main()
