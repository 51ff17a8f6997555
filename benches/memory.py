#!/usr/bin/env python3
"""Bytes per live key, Sluice against Redis + Lua, measured alike.

Each target starts fresh; its RSS (/proc/<pid>/status) is read, every one
of N keys is touched once (`sluice bench --dist seq`, a period of 1000
hours so none refills, expires or is swept), and RSS is read again:
bytes per key = RSS growth ÷ N, the same for both. Redis's `used_memory`
growth is printed beside it (what Redis itself counts: RSS less its
allocator's slack). Keys: the bench's own (`k<n>`, at most 8 bytes) and
28-byte API-key-like ones (`--key-bytes 28`); token bucket on both (the
Lua script is a token bucket); 1M and 10M keys unless `--keys` says. A
sliding window counter costs Sluice the same entry; in Redis it is a
3-field hash, measured too (written by `redis-cli --pipe`).

Usage: benches/memory.py [--keys 1000000,10000000]
Installs redis-server if missing and builds the binary if needed (as
benches/redis.py does); starts and stops everything it uses.
"""

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import BIN, Cluster, metrics  # noqa: E402
from redis import Redis, bench, ensure_binary, ensure_redis, rss  # noqa: E402

# Decisions per second the generator at least reaches on each target with
# batches of 100 (well under what it does reach): a run lasts long enough
# to touch every key.
FLOOR_RATE = {"sluice": 150_000, "redis": 40_000}


def touch_all(target, server, keys, key_bytes):
    """Touch each of `keys` keys once; exits if a run fell short."""
    seconds = max(5, round(keys / FLOOR_RATE[target]))
    extra = ["--dist", "seq", "--keys", str(keys), "--items", "100", "--concurrency", "16",
             "--limit", "1000", "--duration-ms", str(1000 * 3600 * 1000),
             "--key-bytes", str(key_bytes), "--name", "mem"]
    r = bench(target, server, seconds, extra, base=False)
    if r["errors"] or r["decisions"] < keys:
        sys.exit(f"memory run on {target}: {r['decisions']} decisions of {keys} keys, "
                 f"{r['errors']} errors")


def metric(http, name):
    for line in metrics(http).splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    sys.exit(f"no {name} in {http}/metrics")


def sluice_rss(keys, key_bytes, bin=BIN):
    """RSS growth of a fresh node (`bin`) over `keys` keys, every one held
    (its key and byte bounds far above them: nothing evicted)."""
    node = Cluster(1, extra=["--max-keys", str(2 * keys)], bin=bin,
                   env={"SLUICE_LIMITS__MAX_MEMORY": str(max(1 << 30, 400 * keys))})
    try:
        time.sleep(1)
        before = rss(node.procs[0].pid)
        touch_all("sluice", node, keys, key_bytes)
        held = metric(node.http[0], "sluice_keys")
        if held != keys:
            sys.exit(f"sluice holds {held:.0f} keys, not {keys}")
        return rss(node.procs[0].pid) - before
    finally:
        node.stop()


def redis(keys, key_bytes):
    server = Redis()
    try:
        time.sleep(1)
        before, used = rss(server.proc.pid), server.used_memory()
        touch_all("redis", server, keys, key_bytes)
        dbsize = int(server.cli("DBSIZE"))
        if dbsize != keys:
            sys.exit(f"redis holds {dbsize} keys, not {keys}")
        return {"rss": rss(server.proc.pid) - before, "used": server.used_memory() - used}
    finally:
        server.stop()


def redis_window_hashes(keys, key_bytes):
    """RSS growth of a fresh Redis over `keys` sliding-window-counter keys
    as a Lua script would keep them: a 3-field hash (window start, previous
    and current counts) with a PEXPIRE each, written with `redis-cli
    --pipe` (no script needed to measure what the keys hold)."""
    server = Redis()
    try:
        time.sleep(1)
        before = rss(server.proc.pid)
        ttl = str(1000 * 3600 * 1000)

        def command(*args):
            return "".join([f"*{len(args)}\r\n"] + [f"${len(a)}\r\n{a}\r\n" for a in args])

        width = max(key_bytes - 1, 0)
        with subprocess.Popen(["redis-cli", "-p", str(server.port), "--pipe"],
                              stdin=subprocess.PIPE, stdout=subprocess.DEVNULL) as pipe:
            for n in range(keys):
                key = f"mem:k{n:0>{width}}"
                pipe.stdin.write(command("HSET", key, "start", "1764633600000", "prev", "417",
                                         "curr", "93").encode())
                pipe.stdin.write(command("PEXPIRE", key, ttl).encode())
            pipe.stdin.close()
            pipe.wait()
        dbsize = int(server.cli("DBSIZE"))
        if dbsize != keys:
            sys.exit(f"redis holds {dbsize} window keys, not {keys}")
        return rss(server.proc.pid) - before
    finally:
        server.stop()


def measure(counts, widths=(0, 28), windows=False):
    """{(keys, key_bytes): {"sluice": B/key, "redis": B/key, "redis_used": B/key,
    "redis_window": B/key (with `windows`)}}: Sluice's figure holds for every
    algorithm but the sliding log (one entry size; `benches/store.rs`)."""
    out = {}
    for keys in counts:
        for width in widths:
            a, b = sluice_rss(keys, width), redis(keys, width)
            out[(keys, width)] = {"sluice": a / keys, "redis": b["rss"] / keys,
                                  "redis_used": b["used"] / keys}
            if windows:
                out[(keys, width)]["redis_window"] = redis_window_hashes(keys, width) / keys
    return out


def table(results):
    lines = ["| keys | unique key | Sluice B/key (RSS) | Redis token bucket B/key (RSS) "
             "| Sluice ÷ Redis | Redis B/key (used_memory) | Redis 3-field window B/key (RSS) "
             "| Sluice ÷ Redis window |",
             "|---|---|---|---|---|---|---|---|"]
    for (keys, width), r in results.items():
        key = f"{width} bytes" if width else "`k<n>` (≤ 8 bytes)"
        w = r.get("redis_window")
        window = f"| {w:.0f} | **{r['sluice'] / w:.2f}×** |" if w else "| – | – |"
        lines.append(f"| {keys:,} | {key} | {r['sluice']:.0f} | {r['redis']:.0f} "
                     f"| **{r['sluice'] / r['redis']:.2f}×** | {r['redis_used']:.0f} {window}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", default="1000000,10000000",
                    help="comma-separated key counts")
    args = ap.parse_args()
    ensure_redis()
    ensure_binary()
    counts = [int(k) for k in args.keys.split(",")]
    version = subprocess.run([BIN, "--version"], capture_output=True, text=True).stdout.strip()
    results = measure(counts, windows=True)
    print(f"## Bytes per live key ({time.strftime('%Y-%m-%d')}; {version}; "
          f"`benches/memory.py --keys {args.keys}`)")
    print()
    print(table(results))


if __name__ == "__main__":
    main()
