#!/usr/bin/env python3
"""Prometheus in the loop: a real Prometheus scrapes a real 3-node Sluice
cluster every second and evaluates deploy/prometheus/sluice-rules.yml (a temp
copy whose `for:` durations are all 5 s, nothing else changed), while
`sluice bench` loads every node with keys that get refused. Asserted over
Prometheus's HTTP API, each condition awaited with a deadline:

  1. every recording rule evaluates without error, and the ones the load
     feeds have series: sluice:decisions:rate1m > 0 for under_limit and
     over_limit on every node, both p99s finite on every node,
     sluice:tiered_decisions:rate1m > 0;
  2. with the cluster whole, no alert fires (for 15 s past the first
     evaluations), and no approximate answer is counted while every owner
     is reachable;
  3. after `kill -9` of one node: SluiceNodeDown fires for its instance and
     SluiceOwnerUnreachable on a surviving node (the survivors' load keeps
     asking for the keys the dead node owned),
     sluice:fallback_decisions:rate1m{mode="lease"} > 0 there, those
     fallbacks are not counted as approximate-while-reachable, and nothing
     fires beyond what a dead member explains (the survivors' breakers to
     it, their replication lag to it);
  4. deploy/grafana/sluice.json: every query evaluates without error, and
     every metric name its queries use (recording rules and Prometheus's
     own `up`/`ALERTS` aside) is exported by a surviving node's /metrics.

One deviation from the defaults, in the cluster and not in the rules: the
nodes run with cluster.phi_threshold 125, so a killed member stays in the
rings ~10 s (default phi 10: ~1.2 s). That stands in for an owner gossip
still lists but forwards cannot reach (the fault SluiceOwnerUnreachable is
for); with the defaults a kill moves the dead node's keys to their
successors within ~1.2 s, its fallbacks stay under the alert's 1% of a
minute's decisions, and the alert rightly does not fire.

Usage: tests/prometheus_loop.py [path/to/sluice]   (needs pyyaml; installs
Debian's prometheus package through deploy/prometheus/install.sh if
`prometheus` is not on PATH)
"""

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_cluster import LocalCluster, free_port  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RULES = os.path.join(ROOT, "deploy", "prometheus", "sluice-rules.yml")
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "sluice.json")
FOR = "5s"
BUDGET = 150
SECRET = "prometheus-loop-secret"
# Series Prometheus makes itself, not a node: excluded from the dashboard's
# names-in-/metrics check.
PROMETHEUS_OWN = {"up", "ALERTS", "ALERTS_FOR_STATE", "scrape_duration_seconds",
                  "scrape_samples_scraped", "scrape_series_added"}
# Recording rules with no series on a healthy cluster, by design:
# approximate answers with every owner reachable (asserted absent or 0).
EMPTY_WHEN_HEALTHY = {"sluice:approximate_while_reachable:rate1m"}
# Fed only once an owner is unreachable: asserted after the kill.
AFTER_KILL = {"sluice:fallback_decisions:rate1m"}


def http_get(url, timeout=2):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


class Failure(Exception):
    pass


class TooLong(Exception):
    """The whole run's bound passed (not a Failure: await_ must not retry it)."""


def await_(what, check, deadline):
    """Poll `check` until it returns something truthy; fail after
    `deadline` seconds naming `what` and the last thing `check` said."""
    until = time.time() + deadline
    last = None
    while True:
        try:
            got = check()
            if got:
                return got
        except Failure as e:
            last = str(e)
        except (OSError, ValueError, KeyError) as e:
            last = repr(e)
        if time.time() > until:
            raise Failure(f"timed out after {deadline} s waiting for {what}" + (f": {last}" if last else ""))
        time.sleep(0.5)


# --- /metrics ---------------------------------------------------------------

def exposed_names(text):
    """Every sample name a /metrics text can be queried by: the names of
    its samples, and for each `# TYPE` family (with or without samples yet)
    the names its type gives (a counter `x` is `x_total`, a histogram
    `x_bucket`, `x_sum`, `x_count`)."""
    samples, declared = set(), set()
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"],
                "summary": ["", "_sum", "_count"], "gauge": [""], "unknown": [""]}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(None, 3)
            declared.update(family + s for s in suffixes.get(kind.strip(), [""]))
        elif line and not line.startswith("#"):
            samples.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return samples, declared


def metric_value(text, name, **labels):
    """Sum of `name`'s samples whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


# --- PromQL -------------------------------------------------------------------

PROMQL_WORDS = {
    # operators and modifiers
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "offset", "bool", "atan2",
    # number literals
    "inf", "nan",
}


def metric_names(expr):
    """The metric names an expression selects: strings, label matchers,
    ranges, grouping label lists, Grafana variables, numbers and function
    names taken out."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\$\{[^}]*\}|\$\w+", " ", e)
    e = re.sub(r"(?<![\w:])\d+(\.\d*)?([eE][+-]?\d+)?|(?<![\w:])\.\d+([eE][+-]?\d+)?", " ", e)
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        word = m.group(0)
        if re.match(r"\s*\(", e[m.end():]):
            continue  # a function or an aggregation
        if word.lower() in PROMQL_WORDS:
            continue
        names.add(word)
    return names


def dashboard_queries(dashboard):
    """Every panel target's `expr` (rows' nested panels too), and the
    metric selector of each `label_values(...)` variable query."""
    exprs = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    exprs.append((p.get("title", "?"), t["expr"]))
            walk(p.get("panels", []))

    walk(dashboard.get("panels", []))
    variables = []
    for v in dashboard.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.match(r"\s*label_values\((.*),\s*\w+\s*\)\s*$", q or "")
        if m:
            variables.append((f"variable {v['name']}", m.group(1)))
    return exprs, variables


# --- the processes ------------------------------------------------------------

class Cluster(LocalCluster):
    def __init__(self, binary, tmp):
        super().__init__(binary, tmp, SECRET)

    def start(self, n=3):
        super().start(n, env={
            # A killed member stays in the rings ~10 s: see the docstring.
            "SLUICE_CLUSTER__PHI_THRESHOLD": "125",
            # The callers' budget for a forward: the default 10 ms is
            # missed by a CPU-starved machine (a CI VM shared with a
            # build), and each miss is an approximate answer, which is
            # SluiceApproximateWhileReachable's, not this test's.
            "SLUICE_CLUSTER__FORWARD_TIMEOUT": "100ms",
        })

    def metrics(self, node):
        return http_get(f"http://{node['http']}/metrics")[1]

    def whole(self):
        gone = self.exited()
        if gone:
            raise Failure(gone)
        for node in self.nodes:
            if http_get(f"http://{node['http']}/readyz")[0] != 200:
                raise Failure(f"{node['id']} not ready")
            ready = metric_value(self.metrics(node), "sluice_cluster_members", state="ready")
            if ready != len(self.nodes):
                raise Failure(f"{node['id']} sees {ready:g} ready members")
        return True

    def bench(self, name, addrs, *args):
        log = open(os.path.join(self.tmp, f"bench-{name}.log"), "w")
        p = subprocess.Popen(
            [self.binary, "bench", "--addr", ",".join(addrs), "--duration", "600s", *args],
            stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p



class Prometheus:
    def __init__(self, tmp, targets):
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        with open(RULES) as f:
            text = f.read()
        # Only the `for:` durations change (shorter `for:` is what the rules
        # file's tests and this loop may change); checked below.
        rewritten = re.sub(r"(?m)^(\s+)for: \S+$", rf"\g<1>for: {FOR}", text)
        original, ours = yaml.safe_load(text), yaml.safe_load(rewritten)
        alerts = 0
        for g0, g1 in zip(original["groups"], ours["groups"]):
            for r0, r1 in zip(g0["rules"], g1["rules"]):
                if "alert" in r0:
                    alerts += 1
                    assert r1.get("for") == FOR, r1
                    r1 = {k: v for k, v in r1.items() if k != "for"}
                    r0 = {k: v for k, v in r0.items() if k != "for"}
                assert r0 == r1, f"the rewritten rules differ beyond for: {r0} / {r1}"
        self.rules = ours
        self.rules_path = os.path.join(tmp, "sluice-rules.yml")
        with open(self.rules_path, "w") as f:
            f.write(rewritten)
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [self.rules_path],
            "scrape_configs": [{"job_name": "sluice", "static_configs": [{"targets": targets}]}],
        }
        self.config_path = os.path.join(tmp, "prometheus.yml")
        with open(self.config_path, "w") as f:
            yaml.safe_dump(config, f)
        print(f"     rules: {alerts} alerts with for: {FOR}; scrape and evaluation every 1 s")
        self.proc = None

    def start(self, binary):
        self.log = open(os.path.join(self.tmp, "prometheus.log"), "w")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={self.config_path}",
             f"--storage.tsdb.path={os.path.join(self.tmp, 'tsdb')}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def api(self, path, **params):
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            body = http_get(url, timeout=5)[1]
        except urllib.error.HTTPError as e:
            body = e.read().decode()
        answer = json.loads(body)
        if answer.get("status") != "success":
            raise Failure(f"{path} {params}: {answer.get('errorType')}: {answer.get('error')}")
        return answer["data"]

    def query(self, q):
        """An instant query: [(labels, value)]."""
        data = self.api("query", query=q)
        if data["resultType"] != "vector":
            raise Failure(f"{q}: a {data['resultType']}, not a vector")
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def alerts(self, state="firing"):
        return [a for a in self.api("alerts")["alerts"] if a["state"] == state]

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def describe(alerts):
    return sorted({f"{a['labels']['alertname']}{{instance={a['labels'].get('instance')}"
                   + (f",peer={a['labels']['peer']}" if "peer" in a["labels"] else "") + "}"
                   for a in alerts})


def main():
    binary = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/sluice")
    started = time.time()
    phases = []

    def phase(name, t0):
        took = time.time() - t0
        phases.append((name, took))
        print(f"---- {name}: {took:.1f} s", flush=True)
        return time.time()

    t = time.time()
    if not shutil.which("prometheus"):
        subprocess.run([os.path.join(ROOT, "deploy", "prometheus", "install.sh")], check=True)
    prometheus_bin = shutil.which("prometheus") or sys.exit("prometheus loop: no prometheus binary")
    version = subprocess.run([prometheus_bin, "--version"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True).stdout
    print("     " + (version.splitlines() or ["prometheus: no version"])[0])
    t = phase("prometheus installed", t)

    # A bound on the whole run: past it, fail (and clean up) rather than hang.
    def too_long(*_):
        raise TooLong(f"over {BUDGET} s in all")
    signal.signal(signal.SIGALRM, too_long)
    signal.alarm(BUDGET)
    tmp = tempfile.mkdtemp(prefix="sluice-prometheus-")
    cluster = Cluster(binary, tmp)
    prom = None
    try:
        cluster.start(3)
        a, b, c = cluster.nodes
        await_("three nodes ready, each seeing three ready members", cluster.whole, 20)
        t = phase("cluster of 3 ready", t)

        prom = Prometheus(tmp, [n["http"] for n in cluster.nodes])
        prom.start(prometheus_bin)
        await_("Prometheus ready", lambda: http_get(f"{prom.url}/-/ready")[0] == 200, 20)
        await_("every target up", lambda: len([v for _, v in prom.query('up{job="sluice"} == 1')]) == 3, 15)
        t = phase("prometheus scraping", t)

        # Load: each node its own caller, at a fixed rate, over 30 keys at
        # 5 per second each (about twice that is offered: half refused);
        # two thirds of each node's keys are owned by the others. A hot
        # key in tiered mode through two nodes.
        exact = ["--rate", "100", "--concurrency", "8", "--keys", "30", "--limit", "5",
                 "--duration-ms", "1000", "--name", "loop"]
        benches = {n["id"]: cluster.bench(n["id"], [n["grpc"]], *exact) for n in cluster.nodes}
        cluster.bench("tiered", [a["grpc"], b["grpc"]], "--mode", "tiered", "--dist", "hot",
                      "--keys", "1", "--rate", "20", "--concurrency", "4", "--limit", "1000",
                      "--duration-ms", "1000", "--name", "hot")
        # One invalid request per node (an empty name): a refusal before
        # deciding, counted by field.
        for n in cluster.nodes:
            req = urllib.request.Request(f"http://{n['http']}/v1/check", method="POST", data=json.dumps(
                {"name": "", "unique_key": "k", "limit": 1, "duration_ms": 1000}).encode())
            try:
                urllib.request.urlopen(req, timeout=2)
                raise Failure(f"{n['id']}: an empty name was accepted")
            except urllib.error.HTTPError as e:
                assert e.code == 400, e.code

        # 1. The recording rules.
        records = [r["record"] for g in prom.rules["groups"] for r in g["rules"] if "record" in r]
        instances = sorted(n["http"] for n in cluster.nodes)

        def per_instance(q, ok):
            got = {m.get("instance"): v for m, v in prom.query(q)}
            bad = [i for i in instances if i not in got or not ok(got[i])]
            if bad:
                raise Failure(f"{q}: {got}")
            return got

        def recording_rules():
            rules = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
            bad = [f"{r['name']}: {r.get('lastError')}" for r in rules if r["health"] != "ok"]
            if bad or len(rules) != sum(len(g["rules"]) for g in prom.rules["groups"]):
                raise Failure(f"rules not evaluated ok: {bad or len(rules)}")
            for status in ("under_limit", "over_limit"):
                per_instance(f'sum by (instance) (sluice:decisions:rate1m{{status="{status}"}})', lambda v: v > 0)
            for rule in ("sluice:check_duration_seconds:p99_1m", "sluice:forward_duration_seconds:p99_1m"):
                per_instance(rule, lambda v: math.isfinite(v) and v > 0)
            if not sum(v for _, v in prom.query("sluice:tiered_decisions:rate1m")) > 0:
                raise Failure("sluice:tiered_decisions:rate1m: no positive series")
            return True

        await_("the recording rules' series", recording_rules, 30)
        for record in records:
            got = prom.query(record)
            print(f"ok   {record}: {len(got)} series"
                  + (f", sum {sum(v for _, v in got if math.isfinite(v)):.4g}" if got else ""))
            if record not in EMPTY_WHEN_HEALTHY | AFTER_KILL and not got:
                raise Failure(f"{record} has no series under load")
        for status in ("under_limit", "over_limit"):
            got = per_instance(f'sum by (instance) (sluice:decisions:rate1m{{status="{status}"}})', lambda v: v > 0)
            print(f"ok   sluice:decisions:rate1m{{status=\"{status}\"}} per node: "
                  + ", ".join(f"{v:.1f}/s" for _, v in sorted(got.items())))
        t = phase("load on, recording rules have series", t)

        # 2. Quiet while all is well: long enough past the first series for
        # any alert whose condition held to have fired (for: 5 s).
        quiet_until = time.time() + 15
        while time.time() < quiet_until:
            firing = prom.alerts("firing")
            if firing:
                raise Failure(f"alerts fire while the cluster is whole: {describe(firing)}")
            approximate = [(m, v) for m, v in prom.query("sluice:approximate_while_reachable:rate1m") if v > 0]
            if approximate:
                raise Failure(f"approximate answers with every owner reachable: {approximate}")
            time.sleep(1)
        pending = prom.alerts("pending")
        print("ok   no alert fired for 15 s with the cluster whole"
              + (f" (pending: {describe(pending)})" if pending else ""))
        t = phase("quiet while whole", t)

        # 3. kill -9 one node; the others keep asking for its keys.
        benches[c["id"]].kill()
        c["proc"].send_signal(signal.SIGKILL)
        c["proc"].wait()
        killed_at = time.time()
        survivors = [a, b]
        survivor_instances = {n["http"] for n in survivors}
        print(f"     killed {c['id']} ({c['http']}) with SIGKILL")

        def fired(name, instances):
            firing = [x for x in prom.alerts("firing") if x["labels"]["alertname"] == name
                      and x["labels"].get("instance") in instances]
            return firing

        down = await_(f"SluiceNodeDown for {c['http']}", lambda: fired("SluiceNodeDown", {c["http"]}), 30)
        print(f"ok   SluiceNodeDown fires for {c['http']} {time.time() - killed_at:.1f} s after the kill")
        unreachable = await_("SluiceOwnerUnreachable on a surviving node",
                             lambda: fired("SluiceOwnerUnreachable", survivor_instances), 30)
        print(f"ok   SluiceOwnerUnreachable fires on {sorted(x['labels']['instance'] for x in unreachable)} "
              f"{time.time() - killed_at:.1f} s after the kill (value {float(unreachable[0]['value']):.3f})")
        lease = [(m["instance"], v) for m, v in prom.query('sluice:fallback_decisions:rate1m{mode="lease"}')
                 if m.get("instance") in survivor_instances and v > 0]
        if not lease:
            raise Failure("sluice:fallback_decisions:rate1m{mode=\"lease\"}: no positive series on a survivor")
        print("ok   sluice:fallback_decisions:rate1m{mode=\"lease\"}: "
              + ", ".join(f"{i} {v:.2f}/s" for i, v in sorted(lease)))
        approximate = [(m, v) for m, v in prom.query("sluice:approximate_while_reachable:rate1m") if v > 0]
        if approximate:
            raise Failure(f"fallbacks for a dead owner counted as approximate while reachable: {approximate}")
        print("ok   the dead owner's fallbacks are not counted as approximate while reachable")
        # What else a dead member may fire, and about whom: the survivors'
        # breakers to it (probed while its keys are asked for), and their
        # replicas to it falling behind (it was their successor). Anything
        # else (SluiceMinority with two of three up, say) is a failure.
        def allowed(x):
            name, labels = x["labels"]["alertname"], x["labels"]
            if name == "SluiceNodeDown":
                return labels.get("instance") == c["http"]
            if name == "SluiceBreakerOpen":
                return labels.get("instance") in survivor_instances and labels.get("peer") == c["id"]
            return name in ("SluiceOwnerUnreachable", "SluiceReplicationLagHigh") \
                and labels.get("instance") in survivor_instances
        firing = prom.alerts("firing")
        unexpected = [x for x in firing if not allowed(x)]
        if unexpected:
            raise Failure(f"unexpected alerts after the kill: {describe(unexpected)}")
        expected = set(describe(down + unreachable))
        others = [x for x in describe(firing) if x not in expected]
        print(f"     also firing (allowed): {', '.join(others) or 'nothing'}")
        t = phase("kill -9: alerts fire", t)

        # 4. The dashboard: every query evaluates; every metric it names is
        # exported by a surviving node.
        with open(DASHBOARD) as f:
            dashboard = json.load(f)
        exprs, variables = dashboard_queries(dashboard)
        substitute = {"$job": "sluice", "$instance": ".*", "$__rate_interval": "5s", "${datasource}": ""}
        errors, empty = [], []
        for title, expr in exprs:
            q = expr
            for k, v in substitute.items():
                q = q.replace(k, v)
            try:
                if not prom.query(q):
                    empty.append(f"{title}: {expr}")
            except Failure as e:
                errors.append(f"{title}: {e}")
        if errors:
            raise Failure("dashboard queries Prometheus refuses:\n  " + "\n  ".join(errors))
        print(f"ok   the dashboard's {len(exprs)} queries evaluate"
              + (f"; {len(empty)} with no series now:\n       " + "\n       ".join(empty) if empty else ""))
        used = {}
        for title, expr in exprs + variables:
            for name in metric_names(expr):
                used.setdefault(name, title)
        wanted = sorted(n for n in used if ":" not in n and n not in PROMETHEUS_OWN)
        exposed = []
        for n in survivors:
            exposed.append((n["id"],) + exposed_names(cluster.metrics(n)))
        missing, declared_only = [], []
        for name in wanted:
            if any(name in samples for _, samples, _ in exposed):
                continue
            if any(name in declared for _, _, declared in exposed):
                declared_only.append(name)
                continue
            missing.append(f"{name} (panel {used[name]!r})")
        if missing:
            raise Failure("the dashboard uses metrics no surviving node exports:\n  " + "\n  ".join(missing))
        recording = sorted(n for n in used if ":" in n)
        unknown = [n for n in recording if n not in records]
        if unknown:
            raise Failure(f"the dashboard uses recording rules the rules file lacks: {unknown}")
        print(f"ok   the dashboard's {len(wanted)} metric names are on a survivor's /metrics"
              + (f" ({', '.join(declared_only)}: declared, no sample yet)" if declared_only else "")
              + f"; its {len(recording)} recording rules are in the rules file")
        phase("dashboard checked", t)
        print("prometheus loop: " + ", ".join(f"{n} {s:.1f} s" for n, s in phases)
              + f"; total {time.time() - started:.1f} s")
    except (Failure, AssertionError, TooLong) as e:
        print(f"FAIL {e}", file=sys.stderr)
        for name in sorted(os.listdir(tmp)):
            if name.endswith(".log"):
                with open(os.path.join(tmp, name), errors="replace") as f:
                    tail = f.read()[-1500:]
                if tail.strip():
                    print(f"---- {name} (tail)\n{tail}", file=sys.stderr)
        sys.exit(f"prometheus loop: failed after {time.time() - started:.1f} s")
    finally:
        signal.alarm(0)
        if prom:
            prom.stop()
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
