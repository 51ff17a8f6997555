"""Real `sluice serve` processes on loopback for the Python CI stages: free
ports, a shared cluster secret, seeds, and each node's own admin listener
and token file. Shared by tests/prometheus_loop.py and
tests/status_browser.py.
"""

import json
import os
import socket
import subprocess


def free_port():
    return free_ports(1)[0]


_next = [None]


def free_ports(n):
    """`n` distinct loopback ports free for both TCP and UDP, below the
    kernel's ephemeral range (32768+ by default), as tests/common/mod.rs
    picks them. A port from `bind(0)` is in that range, and once released it
    can become the source port of anyone's outgoing connection — a peer's
    gRPC dial, a scrape — before the child process binds it; a CI run lost a
    node that way (its admin port taken, the node exited at start). The
    walk starts at a point spread by process id and never hands out a port
    twice in one process."""
    if _next[0] is None:
        _next[0] = (os.getpid() % 400) * 25
    ports = []
    while len(ports) < n:
        port = 20_000 + _next[0] % 12_000
        _next[0] += 1
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            tcp.bind(("127.0.0.1", port))
            udp.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            tcp.close()
            udp.close()
        ports.append(port)
    return ports


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
        gossip = free_ports(n)
        tcp = iter(free_ports(4 * n))
        for i in range(n):
            node = {
                "id": f"node-{i + 1}",
                "grpc": f"127.0.0.1:{next(tcp)}",
                "http": f"127.0.0.1:{next(tcp)}",
                "peer": f"127.0.0.1:{next(tcp)}",
                "admin": f"127.0.0.1:{next(tcp)}",
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

    def exited(self):
        """A node that has exited, with the end of its log (why it exited:
        a port taken, a bad setting) as the failure's text; None if every
        node runs."""
        for node in self.nodes:
            if node["proc"].poll() is not None:
                path = os.path.join(self.tmp, f"{node['id']}.log")
                with open(path, errors="replace") as f:
                    tail = f.read()[-3000:]
                return f"{node['id']} exited with {node['proc'].returncode}; its log ends:\n{tail}"
        return None

    def log_tails(self, chars=1500):
        """The end of every node's log, for a failure's text."""
        out = []
        for node in self.nodes:
            with open(os.path.join(self.tmp, f"{node['id']}.log"), errors="replace") as f:
                out.append(f"\n--- {node['id']} log ends:\n{f.read()[-chars:]}")
        return "".join(out)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
