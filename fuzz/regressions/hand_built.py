#!/usr/bin/env python3
"""Writes the hand-built regression inputs under fuzz/regressions/<target>/.

Each input is a past edge case of the invariants its harness asserts
(src/fuzzing.rs): a zero limit, a cost above the capacity or at u64::MAX,
the longest duration (100 years), a period of 1 ns under a limit above it,
calendar windows far in the future, reported consumption (debt), merges,
conversions; and for `check_request`, every field's bound on the wire.
The proptest regressions in tests/*.proptest-regressions are where several
of them were first found. tests/fuzz_regressions.rs replays every file and
fails naming the file if a harness panics on it, or if an input no longer
reaches the code it was built for.

Run from the repository root: python3 fuzz/regressions/hand_built.py
The files are committed; rerun only to change or add a case.
"""

import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)))

U64_MAX = (1 << 64) - 1
MAX_DURATION = 100 * 365 * 24 * 3600 * 1_000_000_000
MINUTE = 60 * 1_000_000_000
NOW_2023 = 1_700_000_000_000_000_000
FAR = (1 << 62) - 1  # the harness's latest start (year 2116)

# --- the algorithm harness's input: see `Bytes` in src/fuzzing.rs ---------

TOKEN_BUCKET, GCRA, LEAKY_BUCKET, FIXED_WINDOW, SLIDING_COUNTER, SLIDING_LOG = range(6)
ALGORITHMS = {
    TOKEN_BUCKET: "token_bucket",
    GCRA: "gcra",
    LEAKY_BUCKET: "leaky_bucket",
    FIXED_WINDOW: "fixed_window",
    SLIDING_COUNTER: "sliding_window_counter",
    SLIDING_LOG: "sliding_window_log",
}
BUCKETS = (TOKEN_BUCKET, GCRA, LEAKY_BUCKET)
MINUTE_UNIT, HOUR, DAY, WEEK, MONTH, YEAR = range(6)


def number(v):
    """`Bytes::number`: the shortest encoding of `v`."""
    if v == 0:
        return bytes([0])
    if v == 1:
        return bytes([1])
    if v == U64_MAX:
        return bytes([2])
    if U64_MAX - v < 256:
        return bytes([3, U64_MAX - v])
    if v < 256:
        return bytes([4, v])
    if v & (v - 1) == 0:
        return bytes([5, v.bit_length() - 1])
    return bytes([6]) + struct.pack("<Q", v)


def spec(algorithm, limit, duration=None, unit=None, burst=None, now=NOW_2023):
    out = bytes([algorithm])
    if unit is not None:
        out += bytes([0, unit])
    else:
        out += bytes([1]) + number(duration)
    out += number(limit) + number(burst or 0) + bytes([0 if burst is not None else 1])
    return out + number(now)


def decide(hits, after=0, drain=False, nodelay=False):
    return number(after) + bytes([0]) + number(hits) + bytes([0 if drain else 1, 0 if nodelay else 1])


def absorb(hits, after=0, back=0):
    return number(after) + bytes([3]) + number(hits) + number(back)


def merge(peer_hits, after=0):
    return number(after) + bytes([4]) + number(peer_hits)


def convert(algorithm, limit, duration, after=0):
    return number(after) + bytes([5, algorithm]) + number(limit) + number(duration)


def algorithm_cases():
    cases = {}
    for a, name in ALGORITHMS.items():
        burst = 5 if a in BUCKETS else None
        # limit = 0 denies everything, whatever the burst; peeks, drains,
        # reports and merges leave reset_at at now.
        cases[f"zero_limit_{name}"] = spec(a, 0, MINUTE, burst=burst) + (
            decide(1) + decide(0) + decide(1, drain=True) + absorb(10, after=1)
            + decide(1, after=1) + merge(1) + decide(U64_MAX, after=1 << 20, drain=True)
        )
        # A cost above the capacity, up to u64::MAX, drained and not; then
        # u64::MAX hits reported (debt that saturates), and time moving on.
        cases[f"huge_cost_{name}"] = spec(a, 10, MINUTE) + (
            decide(U64_MAX) + decide(U64_MAX - 1, drain=True) + decide(11) + decide(10)
            + absorb(U64_MAX, after=1) + decide(1, after=1 << 39) + merge(U64_MAX)
            + decide(0, after=(1 << 40) - 1) + decide(1, after=(1 << 40) - 1)
        )
        # The longest duration with the largest limit and burst the harness
        # takes, far in the future: window ends and refills nearest u64::MAX.
        limit = 64 if a == SLIDING_LOG else U64_MAX
        cases[f"max_duration_{name}"] = spec(
            a, limit, MAX_DURATION, burst=U64_MAX if a in BUCKETS else None, now=FAR
        ) + (
            decide(U64_MAX) + decide(1) + decide(limit, drain=True) + decide(1, after=1)
            + merge(limit) + decide(1, after=(1 << 40) - 1)
            + convert(a, 1, MAX_DURATION) + convert((a + 1) % 6, U64_MAX, 1)
        )
    # A period of 1 ns (and 7 ns) under a limit above it: more than one token
    # per nanosecond, a huge cost (tests/algorithm_*.proptest-regressions).
    for a in BUCKETS:
        name = ALGORITHMS[a]
        cases[f"sub_nanosecond_{name}"] = spec(a, 3_000_000_007, 1) + (
            decide(142_715_565_754_830_953) + decide(1) + decide(3_000_000_007, after=1)
            + decide(1, after=7)
        )
        cases[f"seven_ns_{name}"] = spec(a, 227, 7) + (
            decide(67_499_749_063_878_975) + decide(1, after=101) + decide(1)
            + decide(5_601_466_033_858_254_443, after=37)
        )
        # Reported consumption far beyond the burst, paid back as time
        # passes: reset_at beyond one refill, never going back.
        cases[f"debt_{name}"] = spec(a, 10, MINUTE, burst=20) + (
            decide(20) + absorb(1_000, back=1 << 29) + decide(1, after=1 << 39)
            + decide(0, after=1 << 39) + merge(5) + decide(1, after=(1 << 40) - 1)
            + absorb(U64_MAX) + decide(1)
        )
    # Calendar windows: each unit from a full window through the boundary,
    # at a realistic time and far in the future (the week of 1970 clamped
    # to the epoch at now = 0).
    for unit, uname in enumerate(["minute", "hour", "day", "week", "month", "year"]):
        for tag, now in [("2023", NOW_2023), ("far", FAR), ("epoch", 0)]:
            cases[f"calendar_{uname}_{tag}"] = spec(FIXED_WINDOW, 2, unit=unit, now=now) + (
                decide(2) + decide(1) + decide(1, drain=True) + absorb(3)
                + decide(1, after=(1 << 40) - 1) + decide(2, after=(1 << 40) - 1)
                + merge(2) + decide(1)
            )
    # The sliding counter across adjacent windows (prev takes curr), then a
    # gap of more than one (prev cleared): reset_at steps forward only.
    cases["sliding_counter_adjacent_windows"] = spec(SLIDING_COUNTER, 10, 1 << 30) + (
        decide(10) + decide(1, after=1 << 29) + decide(5, after=1 << 30)
        + decide(1, after=1 << 29) + decide(1, after=1 << 32) + merge(10) + decide(0)
    )
    # The sliding log with limit 1 and many reported hits at distinct times:
    # entries folded to the bound, the newest kept.
    cases["sliding_log_fold"] = spec(SLIDING_LOG, 1, MINUTE) + b"".join(
        absorb(1 + i, after=1000) for i in range(20)
    ) + decide(1) + decide(1, after=MINUTE) + merge(1)
    return cases


# --- the check_request harness's input: a protobuf `sluice.v1.CheckRequest`


def varint(v):
    v &= U64_MAX
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_int(n, v):
    return varint(n << 3) + varint(v)


def field_bytes(n, b):
    return varint(n << 3 | 2) + varint(len(b)) + b


def request(**f):
    """A `RateLimitRequest`; ints are int64 (negative as 10-byte varints)."""
    numbers = {"hits": 3, "limit": 4, "duration_ms": 5, "window": 6, "burst": 7,
               "algorithm": 8, "drain_over_limit": 9, "nodelay": 10,
               "on_owner_unreachable": 15, "mode": 16}
    out = b""
    out += field_bytes(1, f.pop("name", "api").encode())
    out += field_bytes(2, f.pop("unique_key", "user-1").encode())
    if "policy" in f:
        out += field_bytes(11, f.pop("policy").encode())
    for k, v in f.items():
        out += field_int(numbers[k], int(v))
    return out


def check(*requests):
    return b"".join(field_bytes(1, r) for r in requests)


I64_MAX = (1 << 63) - 1
MAX_DURATION_MS = MAX_DURATION // 1_000_000


def check_request_cases():
    every_algorithm = range(1, 7)
    return {
        # limit 0 denies all, every algorithm, drained and with a huge cost.
        "zero_limit": check(*[
            request(limit=0, duration_ms=60_000, algorithm=a, hits=h, drain_over_limit=d)
            for a in every_algorithm for h, d in [(1, False), (I64_MAX, True)]
        ]),
        # The largest cost a client can send, and a burst as large.
        "huge_cost": check(*[
            request(limit=10, duration_ms=60_000, algorithm=a, hits=I64_MAX)
            for a in every_algorithm
        ] + [
            request(limit=I64_MAX, duration_ms=1, algorithm=a, burst=I64_MAX, hits=I64_MAX)
            for a in (1, 2, 3)
        ]),
        # Exactly 100 years is accepted (decided at the epoch, now and in
        # 2116); 1 ms more, and i64::MAX ms (whose nanoseconds overflow), are
        # refused naming duration_ms.
        "max_duration": check(*[
            request(limit=10_000 if a == 6 else I64_MAX, duration_ms=MAX_DURATION_MS, algorithm=a)
            for a in every_algorithm
        ] + [
            request(limit=10, duration_ms=MAX_DURATION_MS + 1),
            request(limit=10, duration_ms=I64_MAX),
            request(limit=10, duration_ms=-1),
            request(limit=10, duration_ms=0),
        ]),
        # Every calendar window, and the bad ones: unknown, with a duration,
        # on an algorithm that takes none.
        "calendar_windows": check(*[
            request(limit=5, window=w, algorithm=4, hits=2) for w in range(1, 7)
        ] + [
            request(limit=5, window=42, algorithm=4),
            request(limit=5, window=5, duration_ms=1000, algorithm=4),
            request(limit=5, window=5, algorithm=2),
        ]),
        # Keys at the harness's bound (64 bytes) and one byte beyond; empty;
        # multi-byte UTF-8 counted in bytes.
        "key_bounds": check(
            request(name="n" * 64, unique_key="k" * 64, limit=1, duration_ms=1000),
            request(name="n" * 65, limit=1, duration_ms=1000),
            request(unique_key="k" * 65, limit=1, duration_ms=1000),
            request(name="", limit=1, duration_ms=1000),
            request(unique_key="", limit=1, duration_ms=1000),
            request(unique_key="é" * 32, limit=1, duration_ms=1000),
            request(unique_key="é" * 33, limit=1, duration_ms=1000),
        ),
        # Negative numbers, zero bursts, unknown enum values, a policy with
        # inline fields or empty, a sliding log above its bound.
        "bad_fields": check(
            request(limit=-1, duration_ms=1000),
            request(limit=1, duration_ms=1000, hits=-1),
            request(limit=1, duration_ms=1000, burst=-3),
            request(limit=1, duration_ms=1000, burst=0),
            request(limit=0, duration_ms=1000, burst=0),
            request(limit=1, duration_ms=1000, algorithm=99),
            request(limit=1, duration_ms=1000, algorithm=-1),
            request(limit=1, duration_ms=1000, on_owner_unreachable=9),
            request(limit=1, duration_ms=1000, mode=7),
            request(limit=1, duration_ms=1000, burst=2, algorithm=4),
            request(limit=10_001, duration_ms=1000, algorithm=6),
            request(policy="p", limit=5),
            request(policy="p", duration_ms=5),
            request(policy=""),
            request(policy="p"),
            request(),
        ),
        # A period of 1 ms under a limit above the nanoseconds in it.
        "sub_nanosecond": check(*[
            request(limit=3_000_000_007, duration_ms=1, algorithm=a, hits=h)
            for a in every_algorithm if a != 6 for h in (1, 3_000_000_007, 142_715_565_754_830_953)
        ]),
    }


def write(target, cases):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    for name, data in cases.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    write("algorithm", algorithm_cases())
    write("check_request", check_request_cases())
