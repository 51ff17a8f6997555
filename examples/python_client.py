#!/usr/bin/env python3
"""Calling Sluice from Python with generated stubs.

    pip install grpcio grpcio-tools
    python3 examples/python_client.py [127.0.0.1:8081]

Generates the stubs from proto/sluice/v1/ratelimit.proto into a temporary
directory (in an app, generate them once at build time), then checks one
key 12 times at 10 per minute: 10 admitted, then refusals with a retry
time. (With no stubs at all, gRPC reflection works too:
tests/reflection_client.py.)
"""

import os
import subprocess
import sys
import tempfile

import grpc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def stubs():
    out = tempfile.mkdtemp()
    from grpc_tools import protoc  # noqa: PLC0415
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    rc = protoc.main(["protoc", f"-I{ROOT}/proto", f"-I{include}", f"--python_out={out}",
                      f"--grpc_python_out={out}", f"{ROOT}/proto/sluice/v1/ratelimit.proto"])
    if rc != 0:
        sys.exit("protoc failed")
    sys.path.insert(0, out)
    from sluice.v1 import ratelimit_pb2, ratelimit_pb2_grpc  # noqa: PLC0415
    return ratelimit_pb2, ratelimit_pb2_grpc


def main():
    addr = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:8081"
    pb, rpc = stubs()
    stub = rpc.RateLimiterStub(grpc.insecure_channel(addr))
    admitted = 0
    for i in range(12):
        r = stub.Check(pb.CheckRequest(requests=[pb.RateLimitRequest(
            name="python-example", unique_key="alice", limit=10, duration_ms=60_000)]),
            timeout=1.0).responses[0]
        status = pb.Status.Name(r.status)
        admitted += r.status == pb.STATUS_UNDER_LIMIT
        print(f"#{i + 1:<3} {status:<18} remaining {r.remaining}/{r.limit}"
              + (f"  retry after {r.retry_after_ms} ms" if r.retry_after_ms else ""))
    print(f"{admitted} of 12 admitted")


if __name__ == "__main__":
    main()
