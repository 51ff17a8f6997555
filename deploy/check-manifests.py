#!/usr/bin/env python3
"""Check the Kubernetes manifests offline, and that what they ship works:

1. every manifest under deploy/k8s validates (strictly: no unknown fields)
   against the bundled Kubernetes schemas (`kubernetes-validate`);
2. every Sluice container with a read-only root filesystem mounts a
   writable volume where the image has the node write its admin token;
3. the ConfigMap's sluice.toml and rules.yaml load in the real binary: a
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


# The image's SLUICE_ADMIN__TOKEN_FILE (deploy/Dockerfile) lives here.
TOKEN_DIR = "/var/run/sluice"


def token_dir_writable():
    checked = 0
    for name in sorted(os.listdir(K8S)):
        if not name.endswith(".yaml"):
            continue
        with open(os.path.join(K8S, name)) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for doc in docs:
            spec = doc.get("spec", {}).get("template", {}).get("spec", {})
            for c in spec.get("containers", []):
                if not str(c.get("image", "")).startswith("sluice"):
                    continue
                if not c.get("securityContext", {}).get("readOnlyRootFilesystem"):
                    continue
                mounts = [m for m in c.get("volumeMounts", []) if m["mountPath"] == TOKEN_DIR]
                if not mounts or mounts[0].get("readOnly"):
                    sys.exit(f"{name}: container {c['name']} has a read-only root filesystem "
                             f"and no writable volume at {TOKEN_DIR} (its admin token)")
                checked += 1
    if checked == 0:
        sys.exit("no Sluice container found in deploy/k8s")
    print(f"{checked} Sluice containers can write their admin token")


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
        env = dict(os.environ, SLUICE_CLUSTER__GOSSIP_ADDR="127.0.0.1:0", RUST_LOG="warn",
                   SLUICE_ADMIN__ADDR="127.0.0.1:0",
                   SLUICE_ADMIN__TOKEN_FILE=os.path.join(tmp, "admin.token"))
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
    token_dir_writable()
    shipped_config_loads(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/sluice"))
