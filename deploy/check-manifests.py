#!/usr/bin/env python3
"""Check the Kubernetes manifests offline, and that what they ship works:

1. every manifest under deploy/k8s validates (strictly: no unknown fields)
   against the bundled Kubernetes schemas (`kubernetes-validate`), except
   the Prometheus Operator's custom resources (PodMonitor, PrometheusRule),
   which it has no schema for: those are skipped, said so, and checked in 4
   and 5 instead; a document of any other kind without a schema fails;
2. every Sluice container with a read-only root filesystem mounts a
   writable volume where the image has the node write its admin token;
3. the ConfigMap's sluice.toml and rules.yaml load in the real binary: a
   node started with them (paths moved to a temp dir) turns ready;
4. the PrometheusRule carries exactly the groups of
   deploy/prometheus/sluice-rules.yml (the file promtool tests);
5. the PodMonitor selects the DaemonSet's pods, in its namespace, on a
   named port of its Sluice container, with the job label the alerts expect.

Usage: deploy/check-manifests.py [path/to/sluice]
       deploy/check-manifests.py --write-prometheusrule
         (regenerate deploy/k8s/prometheusrule.yaml from the rules file)
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


RULES = os.path.join(ROOT, "deploy", "prometheus", "sluice-rules.yml")
PROMETHEUS_RULE = os.path.join(K8S, "prometheusrule.yaml")

# Custom resources kubernetes-validate has no schema for: not validated
# against one (said so), checked by prometheus_rule_matches and
# pod_monitor_matches instead.
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}


def load_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def is_custom(doc):
    return (doc.get("apiVersion"), doc.get("kind")) in CUSTOM_KINDS


def validate():
    files = sorted(os.path.join(K8S, f) for f in os.listdir(K8S) if f.endswith(".yaml"))
    with tempfile.TemporaryDirectory() as tmp:
        checked, skipped = [], []
        for path in files:
            docs = load_docs(path)
            custom = [d for d in docs if is_custom(d)]
            if not custom:
                checked.append(path)
                continue
            name = os.path.basename(path)
            skipped += [f"{name}: {d['kind']} {d['metadata']['name']}" for d in custom]
            rest = [d for d in docs if not is_custom(d)]
            if rest:
                # The file's other documents still validate.
                checked.append(os.path.join(tmp, name))
                with open(checked[-1], "w") as f:
                    yaml.safe_dump_all(rest, f)
        run = subprocess.run(["kubernetes-validate", "--strict", "--quiet", *checked],
                             capture_output=True, text=True)
    out = run.stdout + run.stderr
    sys.stdout.write(out)
    if run.returncode != 0:
        sys.exit(f"kubernetes-validate failed (exit {run.returncode})")
    # kubernetes-validate only warns about a kind it has no schema for (an
    # apiVersion typo, say) and passes it: here that fails.
    if "Couldn't find schema" in out:
        sys.exit("a manifest has a kind or apiVersion with no schema (see above)")
    print(f"{len(checked)} manifests valid (strict)")
    for s in skipped:
        print(f"{s}: not schema-validated (a Prometheus Operator custom resource; "
              "checked against its sources below)")


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


# The DaemonSet's Unix socket is opt-in: these commented-out lines, once
# uncommented, enable it (its directory must be provisioned on the host).
SOCKET_OPT_IN = ("- name: SLUICE_GRPC_UDS", "value: /var/run/sluice-socket/",
                 "- {name: socket,", "- name: socket", "hostPath: {path: /var/run/sluice-socket")


def with_socket_opted_in(text):
    import re
    return re.sub(r"^(\s*)# (\s*)(.*)$",
                  lambda m: m.group(1) + m.group(2) + m.group(3)
                  if m.group(3).startswith(SOCKET_OPT_IN) else m.group(0),
                  text, flags=re.M)


def socket_dir_shared():
    """A container that serves grpc_uds — the DaemonSet with its opt-in
    lines uncommented — has the socket's directory on a writable hostPath
    volume (the host's app pods mount the same path)."""
    checked = 0
    for name in sorted(os.listdir(K8S)):
        if not name.endswith(".yaml"):
            continue
        with open(os.path.join(K8S, name)) as f:
            docs = [d for d in yaml.safe_load_all(with_socket_opted_in(f.read())) if d]
        for doc in docs:
            spec = doc.get("spec", {}).get("template", {}).get("spec", {})
            volumes = {v["name"]: v for v in spec.get("volumes", [])}
            for c in spec.get("containers", []):
                env = {e["name"]: e.get("value") for e in c.get("env", [])}
                path = env.get("SLUICE_GRPC_UDS")
                if path is None:
                    continue
                if len(path.encode()) > 107:
                    sys.exit(f"{name}: SLUICE_GRPC_UDS {path!r} is longer than a socket path holds")
                directory = os.path.dirname(path)
                mounts = [m for m in c.get("volumeMounts", []) if m["mountPath"] == directory]
                if not mounts or mounts[0].get("readOnly"):
                    sys.exit(f"{name}: container {c['name']} serves {path} with no writable "
                             f"volume at {directory}")
                if "hostPath" not in volumes.get(mounts[0]["name"], {}):
                    sys.exit(f"{name}: {directory} must be a hostPath volume: the host's app "
                             "pods reach the socket through it")
                checked += 1
    if checked == 0:
        sys.exit("no Sluice container serves grpc_uds, even with the DaemonSet's opt-in "
                 "lines uncommented")
    print(f"{checked} Sluice container(s) share their Unix socket's directory with the host "
          "once opted in (deploy/k8s/daemonset.yaml)")


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
        # One node of the fleet, alone: its seeds (the cluster's DNS name)
        # answer nothing here, and with the shipped bootstrap_expect it
        # rightly waits for a peer forever; 1 lets it start alone, so the
        # check sees the rest of the config serve.
        env = dict(os.environ, SLUICE_CLUSTER__GOSSIP_ADDR="127.0.0.1:0", RUST_LOG="warn",
                   SLUICE_CLUSTER__BOOTSTRAP_EXPECT="1",
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


def prometheus_rule_text():
    """deploy/k8s/prometheusrule.yaml as generated from the rules file: its
    groups (comments included, the file's header left out) under `spec`."""
    with open(RULES) as f:
        lines = f.read().splitlines()
    start = lines.index("groups:")
    body = "\n".join(("  " + line) if line else "" for line in lines[start:])
    return f"""# Generated from deploy/prometheus/sluice-rules.yml (unit-tested there by
# deploy/prometheus/check.sh): edit that file, then run
#   python3 deploy/check-manifests.py --write-prometheusrule
# deploy/check-manifests.py fails if the groups here differ from the file's.
# Your Prometheus must select this object (its ruleSelector and
# ruleNamespaceSelector; e.g. kube-prometheus-stack wants a `release` label).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: sluice
  namespace: sluice
  labels: {{app.kubernetes.io/name: sluice}}
spec:
{body}
"""


def find(docs, kind, where):
    found = [d for d in docs if d.get("kind") == kind]
    if len(found) != 1:
        sys.exit(f"{where}: expected one {kind}, found {len(found)}")
    return found[0]


def prometheus_rule_matches():
    rule = find(load_docs(PROMETHEUS_RULE), "PrometheusRule", "deploy/k8s/prometheusrule.yaml")
    with open(RULES) as f:
        groups = yaml.safe_load(f)["groups"]
    got = rule.get("spec", {}).get("groups")
    if got != groups:
        def first_difference():
            if not isinstance(got, list) or len(got) != len(groups):
                return "the number of groups"
            for want, have in zip(groups, got):
                if want == have:
                    continue
                for a, b in zip(want.get("rules", []), have.get("rules", [])):
                    if a != b:
                        return f"group {want['name']!r}, rule {a.get('alert') or a.get('record')!r}"
                return f"group {want['name']!r}"
        sys.exit("deploy/k8s/prometheusrule.yaml differs from deploy/prometheus/sluice-rules.yml "
                 f"(first at {first_difference()}): run "
                 "python3 deploy/check-manifests.py --write-prometheusrule")
    rules = sum(len(g["rules"]) for g in groups)
    print(f"the PrometheusRule carries sluice-rules.yml's {len(groups)} groups ({rules} rules)")


def pod_monitor_matches():
    docs = [d for name in sorted(os.listdir(K8S)) if name.endswith(".yaml")
            for d in load_docs(os.path.join(K8S, name))]
    monitor = find(docs, "PodMonitor", "deploy/k8s")
    daemonset = find(docs, "DaemonSet", "deploy/k8s")
    spec = monitor["spec"]
    pod = daemonset["spec"]["template"]
    pod_labels = pod["metadata"]["labels"]
    selector = spec["selector"]
    if set(selector) != {"matchLabels"} or not selector["matchLabels"]:
        sys.exit("PodMonitor: select by matchLabels only (this check compares them)")
    wrong = {k: v for k, v in selector["matchLabels"].items() if pod_labels.get(k) != v}
    if wrong:
        sys.exit(f"PodMonitor: selector {wrong} does not match the DaemonSet's pod labels {pod_labels}")
    namespace = daemonset["metadata"]["namespace"]
    if namespace not in spec.get("namespaceSelector", {}).get("matchNames", []):
        sys.exit(f"PodMonitor: namespaceSelector.matchNames must name {namespace!r}")
    # The alerts in sluice-rules.yml are for job="sluice".
    job_label = spec.get("jobLabel")
    if pod_labels.get(job_label) != "sluice":
        sys.exit(f"PodMonitor: jobLabel {job_label!r} must name a pod label whose value is "
                 "\"sluice\" (the alerts select job=\"sluice\")")
    sluice = [c for c in pod["spec"]["containers"] if str(c.get("image", "")).startswith("sluice")]
    ports = {p["name"]: p for c in sluice for p in c.get("ports", []) if "name" in p}
    # The HTTP port (/metrics) is the one the liveness probe reaches /healthz on.
    http = {c["livenessProbe"]["httpGet"]["port"] for c in sluice
            if "httpGet" in c.get("livenessProbe", {})}
    for e in spec["podMetricsEndpoints"]:
        if e.get("port") not in ports:
            sys.exit(f"PodMonitor: port {e.get('port')!r} is not a named port of the DaemonSet's "
                     f"Sluice container ({sorted(ports)})")
        if e["port"] not in http or e.get("path", "/metrics") != "/metrics":
            sys.exit(f"PodMonitor: scrape /metrics on the HTTP port ({sorted(http)}), "
                     f"not {e['port']!r} {e.get('path')!r}")
    print(f"the PodMonitor selects the DaemonSet's pods ({selector['matchLabels']}) "
          f"on port {spec['podMetricsEndpoints'][0]['port']!r}, job {pod_labels[job_label]!r}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-prometheusrule"]:
        with open(PROMETHEUS_RULE, "w") as f:
            f.write(prometheus_rule_text())
        print(f"wrote {os.path.relpath(PROMETHEUS_RULE, ROOT)}")
        sys.exit(0)
    validate()
    token_dir_writable()
    socket_dir_shared()
    prometheus_rule_matches()
    pod_monitor_matches()
    shipped_config_loads(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/sluice"))
