#!/usr/bin/env python3
"""Cluster benchmark: server CPU per decision for local and forwarded keys
(batched and unbatched), and the latency forwarding adds at ~10% of peak.

Three server processes and a load generator on a 2-core machine measure the
scheduler more than Sluice, so the headline is CPU per decision, from the
server processes' own accounting (/proc/<pid>/stat), with servers pinned to
core 0 and the generator to core 1 (taskset).

Usage: benches/cluster.py [--seconds 10]   (needs target/release/sluice)
       benches/cluster.py --replication [--seconds 10]
         synchronous against asynchronous replication on the same 3 nodes,
         in one run: CPU per decision and latency, as ratios
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

BIN = os.path.join(os.path.dirname(__file__), "..", "target", "release", "sluice")
TICK = os.sysconf("SC_CLK_TCK")


# Ports below the ephemeral range, never handed out twice (see there).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from local_cluster import free_port, free_ports  # noqa: E402,F401


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def metrics(http):
    """A node's /metrics text (`http`: its http_addr)."""
    return urllib.request.urlopen(f"http://{http}/metrics", timeout=10).read().decode()


def metric_sum(text, name):
    """Sum of a metric's samples in /metrics `text`, over its label sets."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def histogram(text, name):
    """A histogram's cumulative bucket counts in /metrics `text`, {le: count},
    summed over its label sets."""
    buckets = {}
    for line in text.splitlines():
        if not line.startswith(name + "_bucket{"):
            continue
        le = re.search(r'le="([^"]+)"', line).group(1)
        bound = float("inf") if le == "+Inf" else float(le)
        buckets[bound] = buckets.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    return buckets


def quantile(before, after, q):
    """The `q` quantile of what a histogram counted between two reads, as
    Prometheus's histogram_quantile estimates it (linear within the bucket
    it falls in), and that bucket's bounds: (estimate, low, high); None if
    nothing was counted."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return None
    rank, low, below = q * total, 0.0, 0.0
    for bound, count in zip(bounds, counts):
        if count >= rank:
            if bound == float("inf"):
                return (low, low, bound)
            inside = count - below
            return (low + (bound - low) * (rank - below) / max(inside, 1e-9), low, bound)
        low, below = bound, count
    return None


class Cluster:
    def __init__(self, n, pin=True, extra=(), bin=BIN, env=None):
        self.procs, self.grpc, self.http = [], [], []
        seed = None
        for i in range(n):
            grpc = f"127.0.0.1:{free_port()}"
            gossip = free_port()
            node_env = dict(os.environ, RUST_LOG="warn",
                       SLUICE_CLUSTER__GOSSIP_ADDR=f"127.0.0.1:{gossip}",
                       SLUICE_CLUSTER__SECRET="bench-secret",
                       SLUICE_CLUSTER__FORWARD_TIMEOUT="200ms", **(env or {}))
            if seed:
                node_env["SLUICE_CLUSTER__SEEDS"] = f'["127.0.0.1:{seed}"]'
            seed = seed or gossip
            http = f"127.0.0.1:{free_port()}"
            cmd = (["taskset", "-c", "0"] if pin else []) + [
                bin, "serve", "--node-id", f"bench-{i}",
                "--grpc-addr", grpc, "--http-addr", http,
                "--admin-addr", f"127.0.0.1:{free_port()}", *extra]
            self.procs.append(subprocess.Popen(cmd, env=node_env, stdout=subprocess.DEVNULL))
            self.grpc.append(grpc)
            self.http.append(http)
        deadline = time.time() + 30
        while time.time() < deadline:
            if all(self.ready(addr, n) for addr in self.grpc):
                return
            time.sleep(0.2)
        self.stop()  # no node outlives a cluster that did not form
        sys.exit("cluster did not form")

    def status(self, addr):
        # Admin calls are signed with the cluster secret.
        env = dict(os.environ, SLUICE_CLUSTER__SECRET="bench-secret")
        return subprocess.run([BIN, "cluster", "status", "--json", "--addr", addr],
                              capture_output=True, text=True, env=env)

    def ready(self, addr, n):
        out = self.status(addr)
        if out.returncode != 0:
            return False
        return sum(m["in_ring"] for m in json.loads(out.stdout)["members"]) == n

    def in_ring(self, addr):
        out = self.status(addr)
        if out.returncode != 0:
            return -1
        return sum(m["in_ring"] for m in json.loads(out.stdout)["members"])

    def cpu(self):
        return sum(cpu_seconds(p.pid) for p in self.procs)

    def check_durations(self):
        """`sluice_check_duration_seconds`, summed over the nodes: the time
        each node took to answer its Check calls, from its own clock."""
        total = {}
        for http in self.http:
            for bound, count in histogram(metrics(http), "sluice_check_duration_seconds").items():
                total[bound] = total.get(bound, 0.0) + count
        return total

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait()


def bench(cluster, seconds, extra):
    cmd = ["taskset", "-c", "1", BIN, "bench", "--json", "--addr", cluster.grpc[0],
           "--duration", f"{seconds}s", "--keys", "100000", "--limit", "1000000"] + extra
    before = cluster.cpu()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    used = cluster.cpu() - before
    result = json.loads(out.stdout)
    result["server_cpu_s"] = used
    result["cpu_us_per_decision"] = used * 1e6 / max(result["decisions"], 1)
    return result


def crash_detection(runs=3):
    """Seconds from SIGKILL of one of three nodes (default gossip settings)
    until the others' rings drop it."""
    figures = []
    for _ in range(runs):
        c = Cluster(3, pin=False)
        try:
            time.sleep(2)
            started = time.time()
            c.procs[2].kill()
            while c.in_ring(c.grpc[0]) != 2:
                time.sleep(0.05)
            figures.append(time.time() - started)
        finally:
            c.stop()
    return figures


def replication(seconds):
    """What synchronous replication costs per decision: the same 3-node
    cluster, batched closed loop and a fixed open-loop rate, async (the
    baseline) then sync, one row each."""
    three = Cluster(3)
    try:
        rows = {}
        for mode in ["async", "sync"]:
            rows[mode] = (
                bench(three, seconds, ["--concurrency", "64", "--items", "10",
                                       "--replication", mode]),
                bench(three, seconds, ["--rate", "1000", "--replication", mode]),
            )
    finally:
        three.stop()
    print(f"## Synchronous replication ({time.strftime('%Y-%m-%d')}, {seconds} s per row, "
          "3 nodes, 2/3 of keys forwarded)")
    print()
    print("| replication | decisions/s | CPU µs/decision | unavailable | p50 µs | p99 µs | p99.9 µs |")
    print("|---|---|---|---|---|---|---|")
    for mode, (load, lat) in rows.items():
        l = lat["latency_us"]
        print(f"| {mode} | {load['decisions_per_s']:.0f} | {load['cpu_us_per_decision']:.1f} "
              f"| {load['unavailable'] + lat['unavailable']} | {l['p50']} | {l['p99']} | {l['p999']} |")
    a, s = rows["async"], rows["sync"]
    print()
    print(f"sync / async: CPU per decision {s[0]['cpu_us_per_decision'] / a[0]['cpu_us_per_decision']:.2f}×, "
          f"throughput {s[0]['decisions_per_s'] / a[0]['decisions_per_s']:.2f}×, "
          f"p50 {s[1]['latency_us']['p50'] / max(a[1]['latency_us']['p50'], 1):.2f}×, "
          f"p99 {s[1]['latency_us']['p99'] / max(a[1]['latency_us']['p99'], 1):.2f}×")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--replication", action="store_true",
                    help="only sync against async replication")
    args = ap.parse_args()
    if args.replication:
        replication(args.seconds)
        return
    rows = []
    one = Cluster(1)
    try:
        local = bench(one, args.seconds, ["--concurrency", "64", "--items", "10"])
        rows.append(("1 node: all keys local", local))
        peak_local = local["calls_per_s"]
        lat_local = bench(one, args.seconds, ["--rate", str(round(peak_local * 0.1))])
    finally:
        one.stop()
    three = Cluster(3)
    try:
        batched = bench(three, args.seconds, ["--concurrency", "64", "--items", "10"])
        rows.append(("3 nodes: 2/3 of keys forwarded, batched", batched))
        unbatched = bench(three, args.seconds,
                          ["--concurrency", "64", "--items", "10", "--skip-batching"])
        rows.append(("3 nodes: 2/3 of keys forwarded, unbatched", unbatched))
        lat_fwd = bench(three, args.seconds, ["--rate", str(round(peak_local * 0.1))])
        lat_fwd_unbatched = bench(three, args.seconds,
                                  ["--rate", str(round(peak_local * 0.1)), "--skip-batching"])
    finally:
        three.stop()
    crashes = crash_detection()

    print(f"## Cluster CPU per decision ({time.strftime('%Y-%m-%d')}, {args.seconds} s per row)")
    print()
    print("| case | decisions/s | server CPU s | CPU µs/decision | unavailable |")
    print("|---|---|---|---|---|")
    for name, r in rows:
        print(f"| {name} | {r['decisions_per_s']:.0f} | {r['server_cpu_s']:.2f} "
              f"| {r['cpu_us_per_decision']:.1f} | {r['unavailable']} |")
    print()
    rate = round(peak_local * 0.1)
    print(f"## Latency at {rate} calls/s open loop (~10% of the 1-node peak of "
          f"{peak_local:.0f} calls/s of 10 items), 1 item per call, µs from intended start")
    print()
    print("| case | p50 | p90 | p99 | p99.9 |")
    print("|---|---|---|---|---|")
    for name, r in [("1 node (local)", lat_local), ("3 nodes, batched forwards", lat_fwd),
                    ("3 nodes, unbatched forwards", lat_fwd_unbatched)]:
        l = r["latency_us"]
        print(f"| {name} | {l['p50']} | {l['p90']} | {l['p99']} | {l['p999']} |")

    print()
    print("## Crash detection (3 nodes, default gossip_interval 200 ms, phi_threshold 10)")
    print()
    print("SIGKILL of one node until the others' rings drop it: "
          + ", ".join(f"{x:.2f} s" for x in crashes))


if __name__ == "__main__":
    main()
