"""Real `sluice serve` processes on loopback for the Python CI stages: free
ports, a shared cluster secret, seeds, and each node's own admin listener
and token file. Shared by tests/prometheus_loop.py and
tests/status_browser.py.
"""

import json
import os
import socket
import subprocess


def free_port(kind=socket.SOCK_STREAM):
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class LocalCluster:
    """Nodes `node-1`… with their addresses in `nodes` (dicts: id, grpc,
    http, peer, admin, gossip, proc); every process started, nodes and
    helpers alike, is in `procs` and killed by `stop`. Logs go to `tmp`."""

    def __init__(self, binary, tmp, secret):
        self.binary = binary
        self.tmp = tmp
        self.nodes = []
        self.procs = []
        self.secret_file = os.path.join(tmp, "secret")
        with open(self.secret_file, "w") as f:
            f.write(secret + "\n")

    def start(self, n=3, env=None, token=None):
        """Start `n` nodes seeding each other, with `env` added to each
        one's environment; with `token`, each node's admin token file holds
        it (mode 0600), else each node generates its own."""
        gossip = [free_port(socket.SOCK_DGRAM) for _ in range(n)]
        for i in range(n):
            node = {
                "id": f"node-{i + 1}",
                "grpc": f"127.0.0.1:{free_port()}",
                "http": f"127.0.0.1:{free_port()}",
                "peer": f"127.0.0.1:{free_port()}",
                "admin": f"127.0.0.1:{free_port()}",
                "gossip": f"127.0.0.1:{gossip[i]}",
            }
            token_file = os.path.join(self.tmp, f"admin-{i + 1}.token")
            if token is not None:
                fd = os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600)
                os.write(fd, (token + "\n").encode())
                os.close(fd)
            seeds = [f"127.0.0.1:{g}" for j, g in enumerate(gossip) if j != i]
            node_env = dict(
                os.environ,
                RUST_LOG="warn",
                SLUICE_CLUSTER__GOSSIP_ADDR=node["gossip"],
                SLUICE_CLUSTER__PEER_ADDR=node["peer"],
                SLUICE_CLUSTER__SEEDS=json.dumps(seeds),
                SLUICE_CLUSTER__SECRET_FILE=self.secret_file,
                SLUICE_ADMIN__ADDR=node["admin"],
                SLUICE_ADMIN__TOKEN_FILE=token_file,
                **(env or {}),
            )
            log = open(os.path.join(self.tmp, f"{node['id']}.log"), "w")
            node["proc"] = subprocess.Popen(
                [self.binary, "serve", "--node-id", node["id"], "--grpc-addr", node["grpc"],
                 "--http-addr", node["http"]],
                env=node_env, stdout=log, stderr=subprocess.STDOUT)
            self.procs.append(node["proc"])
            self.nodes.append(node)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
