#!/usr/bin/env python3
"""A client with no .proto files: discover Sluice's API through gRPC server
reflection alone and rate-limit through it, as any language could.

Starts the node as the README does (`sluice serve`: no config file, default
ports), then sends 12 checks of one key at limit=10, duration_ms=60000 for
every algorithm: all admit exactly 10 and refuse 2; the refusals carry
retry_after_ms > 0, and the leaky bucket's admissions carry delays 6 s apart.

Usage: tests/reflection_client.py [path/to/sluice]   (needs grpcio,
grpcio-reflection and protobuf; .ci/run installs them)
"""

import subprocess
import sys
import time
import urllib.request

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

ADDR = "127.0.0.1:8081"
READYZ = "http://127.0.0.1:8080/readyz"
SERVICE = "sluice.v1.RateLimiter"


def build_pool(channel):
    """A descriptor pool of every file the service needs, from reflection."""
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    wanted = [reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE)]
    files = {}
    while wanted:
        for reply in stub.ServerReflectionInfo(iter([wanted.pop()])):
            for raw in reply.file_descriptor_response.file_descriptor_proto:
                fd = descriptor_pb2.FileDescriptorProto.FromString(raw)
                if fd.name in files:
                    continue
                files[fd.name] = fd
                for dep in fd.dependency:
                    if dep not in files:
                        wanted.append(
                            reflection_pb2.ServerReflectionRequest(file_by_filename=dep)
                        )
    # Add files to the pool dependencies first.
    pool = descriptor_pool.DescriptorPool()
    added = set()
    while len(added) < len(files):
        progress = False
        for fd in files.values():
            if fd.name not in added and all(d in added for d in fd.dependency):
                pool.Add(fd)
                added.add(fd.name)
                progress = True
        if not progress:
            sys.exit(f"reflection returned unresolvable dependencies: {sorted(files)}")
    return pool


def wait_for(channel, deadline=30):
    """The port, then readiness: a node still joining decides nothing."""
    grpc.channel_ready_future(channel).result(timeout=deadline)
    until = time.time() + deadline
    while True:
        try:
            if urllib.request.urlopen(READYZ, timeout=1).status == 200:
                return
        except OSError:
            pass
        if time.time() > until:
            sys.exit("the node did not turn ready")
        time.sleep(0.05)


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/sluice"
    node = subprocess.Popen([binary, "serve"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        channel = grpc.insecure_channel(ADDR)
        wait_for(channel)
        pool = build_pool(channel)
        service = pool.FindServiceByName(SERVICE)
        method = service.FindMethodByName("Check")
        Request = message_factory.GetMessageClass(method.input_type)
        Response = message_factory.GetMessageClass(method.output_type)
        item_type = method.input_type.fields_by_name["requests"].message_type
        Item = message_factory.GetMessageClass(item_type)
        algorithms = pool.FindEnumTypeByName("sluice.v1.Algorithm")
        status = pool.FindEnumTypeByName("sluice.v1.Status").values_by_name
        check = channel.unary_unary(
            f"/{SERVICE}/Check",
            request_serializer=Request.SerializeToString,
            response_deserializer=Response.FromString,
        )
        failures = []
        for value in algorithms.values:
            if value.number == 0:
                continue
            item = Item(
                name="reflection",
                unique_key=value.name,
                limit=10,
                duration_ms=60000,
                algorithm=value.number,
            )
            answers = [check(Request(requests=[item]), timeout=5).responses[0] for _ in range(12)]
            admitted = [a for a in answers if a.status == status["STATUS_UNDER_LIMIT"].number]
            refused = [a for a in answers if a.status == status["STATUS_OVER_LIMIT"].number]
            line = f"{value.name}: admitted {len(admitted)}, refused {len(refused)}"
            ok = len(admitted) == 10 and len(refused) == 2
            if value.name == "ALGORITHM_LEAKY_BUCKET":
                delays = [a.delay_ms for a in admitted]
                line += f", delays {delays}"
                # Each admitted request waits one emission interval (6 s) more
                # than the one before, less the real time between the calls.
                ok = ok and all(i * 6000 - 1000 <= d <= i * 6000 for i, d in enumerate(delays))
            else:
                retries = [a.retry_after_ms for a in refused]
                line += f", retry_after_ms {retries}"
                ok = ok and all(r > 0 for r in retries)
            print(("ok   " if ok else "FAIL ") + line, flush=True)
            if not ok:
                failures.append(value.name)
        if failures:
            sys.exit(f"reflection client: failed for {failures}")
        print("reflection client: every algorithm enforced through reflection alone")
    finally:
        node.terminate()
        try:
            node.wait(timeout=10)
        except subprocess.TimeoutExpired:
            node.kill()
            sys.exit("sluice did not stop on SIGTERM within 10 s")
        if node.returncode != 0:
            sys.exit(f"sluice exited with {node.returncode}: {node.stderr.read().decode()}")


if __name__ == "__main__":
    main()
