#!/usr/bin/env python3
"""Sluice against the design it replaces — a token-bucket Lua script on one
Redis, called with EVALSHA on every request — in one run, on one machine.

Both targets get the same generator (`sluice bench`, `--target redis` for
Redis), the same callers, keys (10,000, uniform) and token-bucket semantics.
Servers are pinned to core 0 and the generator to core 1 (taskset); the
headline is decisions per *server* CPU-second, from each server process's
own accounting (/proc/<pid>/stat). A run where the server used under 90% of
its core is flagged generator-bound. Targets alternate, A B A B, so drift
in the machine hits both. Latency is open loop (from each call's intended
start: coordinated omission counted) at fixed fractions of Redis's peak.

Usage: benches/redis.py [--seconds 5] [--reps 2] [--baseline PATH]
With --baseline, another build of sluice (e.g. the commit before a refactor)
runs as a third server in the same alternation, and a before/after table
follows the tables (same generator: this build's `sluice bench`).
Installs redis-server (Debian's package) if it is missing, builds the
release binary if needed, starts and stops everything it uses, prints the
tables for benches/README.md and writes benches/redis.png (matplotlib from
PyPI, installed if missing).
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import BIN, Cluster, cpu_seconds, free_port, quantile  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = "10000"
LIMIT = ["--limit", "1000", "--duration-ms", "1000"]


def ensure_redis():
    if shutil.which("redis-server"):
        return
    print("installing redis-server (Debian package)", file=sys.stderr)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if subprocess.run(["apt-get", "install", "-y", "-q", "redis-server"], env=env,
                      stdout=subprocess.DEVNULL).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "-q", "redis-server"], env=env, check=True,
                       stdout=subprocess.DEVNULL)


def ensure_binary():
    # --all-targets, as CI builds: the same features, so nothing is built twice.
    subprocess.run(["cargo", "build", "--release", "--locked", "--all-targets"], cwd=ROOT,
                   check=True)


class Redis:
    """redis-server on a loopback port (and on a Unix socket at
    `unixsocket`, if given), persistence off, pinned to core 0."""

    def __init__(self, unixsocket=None):
        self.port = free_port()
        uds = ["--unixsocket", unixsocket, "--unixsocketperm", "700"] if unixsocket else []
        self.proc = subprocess.Popen(
            ["taskset", "-c", "0", "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--protected-mode", "no", *uds],
            stdout=subprocess.DEVNULL)
        self.addr = f"127.0.0.1:{self.port}"
        deadline = time.time() + 10
        while self.cli("PING") != "PONG":
            if time.time() > deadline:
                self.stop()  # no server outlives a start that failed
                sys.exit("redis-server did not start")
            time.sleep(0.05)

    def cli(self, *args):
        out = subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True,
                             text=True)
        return out.stdout.strip()

    def used_memory(self):
        for line in self.cli("INFO", "memory").splitlines():
            if line.startswith("used_memory:"):
                return int(line.split(":")[1])
        return 0

    def cpu(self):
        return cpu_seconds(self.proc.pid)

    def version(self):
        for line in self.cli("INFO", "server").splitlines():
            if line.startswith("redis_version:"):
                return line.split(":")[1]
        return "?"

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def bench(target, server, seconds, extra, base=True, gen=BIN):
    """One `sluice bench` run against `server` (a Cluster or Redis); `base`:
    the common keys and limit, else `extra` says them; `gen`: the build
    whose `sluice bench` generates the load (benches/generator.py)."""
    if target == "redis":
        addr = ["--target", "redis", "--addr", server.addr]
    else:
        addr = ["--addr", ",".join(server.grpc)]
    common = ["--keys", KEYS, *LIMIT] if base else []
    cmd = ["taskset", "-c", "1", gen, "bench", "--json", "--duration", f"{seconds}s",
           *common, *addr, *extra]
    durations = server.check_durations() if target != "redis" else None
    before, wall = server.cpu(), time.time()
    gen = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    used, wall = server.cpu() - before, time.time() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = json.loads(out.stdout)
    r["generator_core_share"] = ((after.ru_utime + after.ru_stime) - (gen.ru_utime + gen.ru_stime)) \
        / max(r["seconds"], 1e-9)
    r["server_cpu_s"] = used
    r["server_core_share"] = used / max(r["seconds"], 1e-9)
    r["per_cpu_s"] = r["decisions"] / max(used, 1e-9)
    if durations is not None:
        # The server's own time per Check (handler in to handler out, its
        # clock): beside the generator's figure when the generator's core is
        # full and its latency is its own queue.
        p99 = quantile(durations, server.check_durations(), 0.99)
        r["server_check_p99_us"] = None if p99 is None else [round(v * 1e6) for v in p99]
    return r


def alternate(servers, seconds, reps, extra):
    """A B A B …: the best-of-reps of each target (decisions per CPU-second)."""
    runs = {t: [] for t in servers}
    for _ in range(reps):
        for t, s in servers.items():
            runs[t].append(bench(t, s, seconds, extra))
    return {t: max(rs, key=lambda r: r["per_cpu_s"]) for t, rs in runs.items()}


def flag(r):
    return "" if r["server_core_share"] >= 0.9 else " ⚠ generator-bound"


def gen_flag(r):
    """Open loop: the latency is the generator's own if its core was full."""
    return " ⚠" if r["generator_core_share"] >= 0.9 else ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--baseline", help="another sluice binary, benchmarked beside this one")
    args = ap.parse_args()
    ensure_redis()
    ensure_binary()
    s, x = args.seconds, args.reps
    redis, one = Redis(), Cluster(1)
    base = Cluster(1, bin=args.baseline) if args.baseline else None
    results = {}
    try:
        servers = {"sluice": one, "redis": redis}
        if base:
            servers["baseline"] = base
        for callers in (16, 64, 256):
            results[f"1 per call, {callers} callers"] = alternate(
                servers, s, x, ["--concurrency", str(callers)])
        for depth in (16, 100):
            results[f"batch {depth} (Redis: pipeline {depth}), 16 callers"] = alternate(
                servers, s, x, ["--concurrency", "16", "--items", str(depth)])
        peak = results["1 per call, 64 callers"]["redis"]["calls_per_s"]
        latency = {}
        for share in (0.1, 0.25, 0.5, 0.75):
            rate = str(round(peak * share))
            for t, srv in servers.items():
                if t == "baseline":
                    continue
                latency[(share, t)] = bench(t, srv, s, ["--rate", rate, "--concurrency", "256"])
        accuracy = {}
        # Each accuracy run on a key of its own, fresh.
        hot = ["--dist", "hot", "--concurrency", "16"]
        for t, srv in [(t, srv) for t, srv in servers.items() if t != "baseline"]:
            accuracy[f"{t} (1 node)" if t == "sluice" else t] = bench(
                t, srv, s, hot + ["--name", f"hot-{t}"])
        for algo in ("sliding_window_counter", "sliding_window_log"):
            accuracy[algo] = bench("sluice", one, s, hot + ["--algorithm", algo, "--name", algo])
        redis_version = redis.version()
    finally:
        one.stop()
        redis.stop()
        if base:
            base.stop()

    three = Cluster(3)
    redis = Redis()
    base = Cluster(3, bin=args.baseline) if args.baseline else None
    try:
        servers = {"sluice": three, "redis": redis}
        if base:
            servers["baseline"] = base
        results["3-node Sluice (calls round-robin, 2/3 forwarded) vs 1 Redis, 1 per call, 64 callers"] = \
            alternate(servers, s, x, ["--concurrency", "64"])
        accuracy["sluice (3 nodes)"] = bench(
            "sluice", three, s, ["--dist", "hot", "--concurrency", "16", "--name", "hot-cluster"])
    finally:
        three.stop()
        redis.stop()
        if base:
            base.stop()

    # Memory per live key at 1M keys, both targets measured alike (RSS
    # growth; benches/memory.py, which also runs 10M keys and 28-byte keys).
    import memory  # noqa: E402 (imports this module: load it once main runs)
    mem = memory.measure([1_000_000], widths=(0,))[(1_000_000, 0)]
    base_mem = memory.sluice_rss(1_000_000, 0, bin=args.baseline) / 1_000_000 \
        if args.baseline else None
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "redis-results.json"), "w") as f:
        json.dump({"results": results,
                   "latency": {f"{k[0]}/{k[1]}": v for k, v in latency.items()},
                   "accuracy": accuracy}, f, indent=1)
    report(args, results, latency, accuracy, peak, redis_version, mem)
    if args.baseline:
        before_after(args.baseline, results, mem["sluice"], base_mem)


def report(args, results, latency, accuracy, peak, redis_version, mem):
    sluice_version = subprocess.run([BIN, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"## Sluice vs Redis + Lua ({time.strftime('%Y-%m-%d')}; {sluice_version}, "
          f"Redis {redis_version}; `benches/redis.py --seconds {args.seconds} --reps {args.reps}`)")
    print()
    print("Decisions per server CPU-second (best of the alternated runs; ⚠ = server under 90% of its core):")
    print()
    print("| mode | Sluice decisions/s | Sluice per CPU-s | Redis decisions/s | Redis per CPU-s | Sluice ÷ Redis |")
    print("|---|---|---|---|---|---|")
    for mode, r in results.items():
        a, b = r["sluice"], r["redis"]
        print(f"| {mode} | {a['decisions_per_s']:,.0f} | {a['per_cpu_s']:,.0f}{flag(a)} "
              f"| {b['decisions_per_s']:,.0f} | {b['per_cpu_s']:,.0f}{flag(b)} "
              f"| **{a['per_cpu_s'] / b['per_cpu_s']:.2f}×** |")
    print()
    print(f"Latency, open loop, 1 decision per call, µs from intended start; loads are fractions "
          f"of Redis's closed-loop peak ({peak:,.0f} calls/s at 64 callers):")
    print()
    print("(server / generator: each one's share of its core; ⚠ = the generator's core was full, so "
          "the latency is the generator's queue, not the server's)")
    print()
    print("(Sluice's own p99: its `sluice_check_duration_seconds` over the run, handler in to "
          "handler out, estimated within its bucket, with the bucket's bounds)")
    print()
    print("| offered | Sluice p50 | p99 | p99.9 | Sluice's own p99 | server / generator "
          "| Redis p50 | p99 | p99.9 | server / generator |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for share in (0.1, 0.25, 0.5, 0.75):
        ra, rb = latency[(share, "sluice")], latency[(share, "redis")]
        a, b = ra["latency_us"], rb["latency_us"]
        own = ra.get("server_check_p99_us")
        own = f"{own[0]} ({own[1]}–{own[2]})" if own else "–"
        print(f"| {share:.0%} ({peak * share:,.0f}/s) | {a['p50']} | {a['p99']} | {a['p999']} | {own} "
              f"| {ra['server_core_share']:.0%} / {ra['generator_core_share']:.0%}{gen_flag(ra)} "
              f"| {b['p50']} | {b['p99']} | {b['p999']} "
              f"| {rb['server_core_share']:.0%} / {rb['generator_core_share']:.0%}{gen_flag(rb)} |")
    print()
    print(f"Memory per live key at 1M keys (`k<n>` keys), RSS growth for both: Sluice "
          f"{mem['sluice']:.0f} B, Redis {mem['redis']:.0f} B "
          f"(**{mem['sluice'] / mem['redis']:.2f}×**; Redis's own used_memory: "
          f"{mem['redis_used']:.0f} B). More sizes: `benches/memory.py`.")
    print()
    print("Accuracy: one hot key, token bucket 1000/s (burst 1000), 16 callers; exact admits "
          "1000 + 1000 × seconds:")
    print()
    print("| target | admitted | seconds | exact | admitted ÷ exact |")
    print("|---|---|---|---|---|")
    for name, r in accuracy.items():
        if name.startswith("sliding"):
            continue
        exact = 1000 + 1000 * r["seconds"]
        print(f"| {name} | {r['admitted']:,} | {r['seconds']:.2f} | {exact:,.0f} "
              f"| {r['admitted'] / exact:.4f} |")
    c, l = accuracy["sliding_window_counter"], accuracy["sliding_window_log"]
    print()
    print(f"Sliding window counter vs exact log, same hot key, 1000/s: {c['admitted']:,} vs "
          f"{l['admitted']:,} admitted ({(c['admitted'] * l['seconds']) / (l['admitted'] * c['seconds']) - 1:+.2%} "
          f"per second).")
    chart(results, latency)


def before_after(baseline, results, mem, base_mem):
    """`mem`, `base_mem`: bytes per live key of this build and the baseline."""
    """This build against the baseline build, from the same alternated runs."""
    print()
    print(f"This build against `{baseline}` (same run, alternated; decisions per server CPU-second):")
    print()
    print("| mode | baseline | this build | this ÷ baseline |")
    print("|---|---|---|---|")
    for mode, r in results.items():
        a, b = r["sluice"], r["baseline"]
        print(f"| {mode} | {b['per_cpu_s']:,.0f}{flag(b)} | {a['per_cpu_s']:,.0f}{flag(a)} "
              f"| **{a['per_cpu_s'] / b['per_cpu_s']:.2f}×** |")
    print(f"| bytes per live key at 1M keys (RSS growth) | {base_mem:.0f} "
          f"| {mem:.0f} | {mem / base_mem:.2f}× |")


def chart(results, latency):
    try:
        import matplotlib
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "matplotlib"], check=True)
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.5))
    modes = list(results)
    short = {"1 per call, 16 callers": "1/call\n16 callers", "1 per call, 64 callers": "1/call\n64 callers",
             "1 per call, 256 callers": "1/call\n256 callers"}
    labels = [short.get(m, "batch 16" if "batch 16" in m else "batch 100" if "batch 100" in m
                        else "3-node Sluice\nvs 1 Redis") for m in modes]
    xs = range(len(modes))
    ax1.bar([i - 0.2 for i in xs], [results[m]["sluice"]["per_cpu_s"] for m in modes], 0.4,
            label="Sluice")
    ax1.bar([i + 0.2 for i in xs], [results[m]["redis"]["per_cpu_s"] for m in modes], 0.4,
            label="Redis + Lua (batch = pipeline)")
    ax1.set_xticks(list(xs))
    ax1.set_xticklabels(labels, fontsize=8)
    ax1.set_yscale("log")
    ax1.set_ylabel("decisions per server CPU-second (log)")
    ax1.set_title("Efficiency (higher is better)")
    ax1.legend()
    shares = (0.1, 0.25, 0.5, 0.75)
    for t, name in (("sluice", "Sluice"), ("redis", "Redis + Lua")):
        pts = [latency[(s, t)] for s in shares]
        line, = ax2.plot([p["offered_rate"] for p in pts],
                         [p["latency_us"]["p99"] / 1000 for p in pts], marker="o", label=name)
        bound = [p for p in pts if p["generator_core_share"] >= 0.9]
        ax2.scatter([p["offered_rate"] for p in bound], [p["latency_us"]["p99"] / 1000 for p in bound],
                    s=160, facecolors="none", edgecolors=line.get_color())
    ax2.set_yscale("log")
    ax2.set_xlabel("offered calls/s (open loop, 1 decision per call)")
    ax2.set_ylabel("p99 latency, ms (log)")
    ax2.set_title("p99 against load (ringed: generator's core full)")
    ax2.legend()
    fig.tight_layout()
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "redis.png")
    fig.savefig(out, dpi=110)
    print()
    print(f"Chart: {os.path.relpath(out, ROOT)}")


if __name__ == "__main__":
    main()
