#!/usr/bin/env python3
"""Tiered mode vs exact forwarding for one hot key (issue 12).

Three `sluice serve` processes (pinned to core 0) and `sluice bench`
(core 1) calling all three round-robin, every request the same key, A B A B:
exact (every decision by the key's owner: two calls in three are forwarded)
and tiered (edges spend local allotments). Reported per mode: decisions/s,
client p50/p99, server CPU per decision, the share decided without a hop,
and the servers' own Check-duration p99 (the decision inside the node,
without the client's gRPC round trip) from their histograms.

Usage: benches/tiered.py [--seconds 10] [--reps 2]   (needs target/release/sluice)
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from cluster import BIN, Cluster, cpu_seconds, metrics  # noqa: E402


def histogram_p99(texts, name):
    """The upper bound of the bucket holding the 99th percentile, summed
    over the nodes' histograms."""
    buckets = {}
    for text in texts:
        for line in text.splitlines():
            if line.startswith(f"{name}_bucket{{le="):
                le = line.split('le="')[1].split('"')[0]
                buckets[le] = buckets.get(le, 0) + float(line.rsplit(" ", 1)[1])
    order = sorted(buckets, key=lambda b: float("inf") if b == "+Inf" else float(b))
    total = buckets.get("+Inf", 0)
    for le in order:
        if buckets[le] >= 0.99 * total:
            return le
    return "+Inf"


def local_share(texts):
    local = sum(float(l.rsplit(" ", 1)[1]) for t in texts for l in t.splitlines()
                if l.startswith('sluice_tiered_decisions_total{path="local_allotment"}'))
    return local


def run(cluster, https, mode, seconds):
    before_texts = [metrics(h) for h in https]
    cmd = ["taskset", "-c", "1", BIN, "bench", "--json", "--addr", ",".join(cluster.grpc),
           "--duration", f"{seconds}s", "--dist", "hot", "--keys", "1", "--concurrency", "32",
           "--limit", "100000000", "--duration-ms", "1000", "--mode", mode]
    before = cluster.cpu()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    used = cluster.cpu() - before
    r = json.loads(out.stdout)
    after_texts = [metrics(h) for h in https]
    local = local_share(after_texts) - local_share(before_texts)
    return {
        "mode": mode,
        "decisions_per_s": r["decisions_per_s"],
        "p50_us": r["latency_us"]["p50"],
        "p99_us": r["latency_us"]["p99"],
        "server_cpu_us_per_decision": used * 1e6 / max(r["decisions"], 1),
        "local_share": local / max(r["decisions"], 1),
        "server_check_p99_le_s": histogram_p99(after_texts, "sluice_check_duration_seconds"),
        "errors": r["errors"] + r["unavailable"],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    results = []
    for _ in range(args.reps):
        for mode in ("exact", "tiered"):
            # A fresh cluster per run: the servers' histograms are per run.
            https = []
            cluster = Cluster(3, extra=())
            try:
                for p in cluster.procs:
                    cmdline = open(f"/proc/{p.pid}/cmdline").read().split("\0")
                    https.append(cmdline[cmdline.index("--http-addr") + 1])
                results.append(run(cluster, https, mode, args.seconds))
                print(json.dumps(results[-1]), flush=True)
            finally:
                cluster.stop()
    best = {m: max((r for r in results if r["mode"] == m), key=lambda r: r["decisions_per_s"])
            for m in ("exact", "tiered")}
    ratio = best["tiered"]["decisions_per_s"] / best["exact"]["decisions_per_s"]
    cpu = best["exact"]["server_cpu_us_per_decision"] / best["tiered"]["server_cpu_us_per_decision"]
    print(f"tiered / exact: {ratio:.2f}x decisions/s, {cpu:.2f}x less server CPU per decision")


if __name__ == "__main__":
    main()
