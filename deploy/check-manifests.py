#!/usr/bin/env python3
"""Check the Kubernetes manifests offline, and that what they ship works:

1. every manifest under deploy/k8s validates (strictly: no unknown fields)
   against the bundled Kubernetes schemas (`kubernetes-validate`);
2. the ConfigMap's sluice.toml and rules.yaml load in the real binary: a
   node started with them (paths moved to a temp dir) turns ready.

Usage: deploy/check-manifests.py [path/to/sluice]
"""

import os
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
K8S = os.path.join(ROOT, "deploy", "k8s")


def validate():
    files = sorted(os.path.join(K8S, f) for f in os.listdir(K8S) if f.endswith(".yaml"))
    subprocess.run(["kubernetes-validate", "--strict", "--quiet", *files], check=True)
    print(f"{len(files)} manifests valid (strict)")


def shipped_config_loads(binary):
    with open(os.path.join(K8S, "configmap.yaml")) as f:
        data = yaml.safe_load(f)["data"]
    with tempfile.TemporaryDirectory() as tmp:
        os.mkdir(os.path.join(tmp, "rules"))
        with open(os.path.join(tmp, "rules", "rules.yaml"), "w") as f:
            f.write(data["rules.yaml"])
        with open(os.path.join(tmp, "secret"), "w") as f:
            f.write("check-manifests-secret")
        toml = (
            data["sluice.toml"]
            .replace("/etc/sluice-secret/secret", os.path.join(tmp, "secret"))
            .replace("/etc/sluice/rules", os.path.join(tmp, "rules"))
        )
        with open(os.path.join(tmp, "sluice.toml"), "w") as f:
            f.write(toml)
        env = dict(os.environ, SLUICE_CLUSTER__GOSSIP_ADDR="127.0.0.1:0", RUST_LOG="warn")
        node = subprocess.Popen(
            [binary, "serve", "--config", os.path.join(tmp, "sluice.toml"),
             "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:18099"],
            env=env,
        )
        try:
            deadline = time.time() + 30
            while True:
                if node.poll() is not None:
                    sys.exit(f"the ConfigMap's config was refused (exit {node.returncode})")
                try:
                    with urllib.request.urlopen("http://127.0.0.1:18099/readyz", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.time() > deadline:
                    sys.exit("a node with the ConfigMap's config never turned ready")
                time.sleep(0.1)
        finally:
            node.terminate()
            node.wait(timeout=30)
    print("the ConfigMap's sluice.toml and rules.yaml load: the node turned ready")


if __name__ == "__main__":
    validate()
    shipped_config_loads(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/sluice"))
