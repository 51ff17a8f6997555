#!/usr/bin/env python3
"""Fleet stress (issue 49, "No meltdown"): N real nodes on this host, with the
DaemonSet ConfigMap's settings (deploy/k8s/configmap.yaml), every node seeded
with the first three, optionally beside K CPU busy loops; after the run, does
the fleet stand as one cluster?

Samples every node's /status (admin listener, admin token) and /readyz while
it runs and once at the end, then prints one JSON line: distinct rings (as
member sets) and their sizes, nodes ready, views, rejoins and their reasons,
"gossip datagram too large" drops, formation time (all N nodes first showing
one ring of N), splits after formation, gossip bytes per node per second (if
a /metrics series names gossip), load average.

Usage:
  benches/fleet_stress.py --nodes 40 --seconds 120 --busy 2 [--seed S]
      [--bin target/release/sluice] [--interval 2] [--keep] [--stall 1,5] [--check]

--check: exit 1, one "FAIL <what>: <node> <figure>" line per failed
condition on stderr, unless all hold: one ring of N on every node within
30 s; at the end every node ready with the same ring of N; no "gossip
datagram too large" line; no rejoin (log line or generation change) of a
node not stalled; each stall <= 1 s: the node's generation unchanged (after
SIGCONT and at the end) and no peer's /status left it out of its members;
each stall >= 5 s: exactly one rejoin by the end and one ring of N (held
3 s) starting within 20 s of SIGCONT. Peers are swept every 0.25 s while a
node is stopped, so a drop shorter than a sweep can go unseen.

Overall deadline: --seconds + 120 s after start, every child is killed and
the run fails (exit 1, logs kept), with or without --check.

--stall S[,S...] (repeatable): once the fleet first settles (one ring of N,
every node ready: before that no majority of ready members can vote a
burial, so a long stall would go unburied by design), SIGSTOP a node other than the seeds for S seconds, SIGCONT it, and sample
every node's /status every 0.25 s until the fleet has been one ring of N for
3 s (deadline 20 s after SIGCONT); 5 s between stalls. Per stall: the node's
generation before and after, whether it rejoined (and why), how many peers'
views left it out (buried) / out of the ring / at another generation / with
an open breaker / suspecting it (their failure detectors declared it dead;
a burial needs a majority), time to one ring of N again, and its own log
lines about being away, fenced, suspected or rejoining.

Every child (nodes, busy loops, strace) runs in its own process group and is
killed at exit, on an exception, on Ctrl-C / SIGTERM / SIGHUP, at the
deadline, and (PR_SET_PDEATHSIG) if this script itself is SIGKILLed. Logs go to a temporary
directory (kept with --keep, --stall, rejoins or when the run fails; its
path is in the JSON and on stderr's last line).
"""

import argparse
import atexit
import collections
import concurrent.futures
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no benches/__pycache__ from importing cluster
from cluster import cpu_seconds, free_ports, metrics  # noqa: E402

CONFIGMAP = os.path.join(HERE, "..", "deploy", "k8s", "configmap.yaml")
SECRET = "fleet-stress-secret-0123456789abcdef"
TOKEN = "fleet-stress-admin-token-0123456789"

REJOIN = "rejoining as a new member"
TOO_LARGE = "gossip datagram too large"
# Other lines worth counting (substrings of the message).
WATCH = {
    "rejoins": REJOIN,
    "datagram_too_large": TOO_LARGE,
    "away": "this node was away",
    "back_not_dead": "back from away and not declared dead",
    "rejoined_ready": "rejoined: ready",
    "suspected_by_majority": "suspected by nearly a majority",
    "no_majority_heard": "no majority heard lately",
    "majority_lost": "majority of the cluster lost",
    "restart_failed": "gossip restart failed",
}


# Every child process (nodes, busy loops, strace), each the leader of its own
# process group, so that every exit path (normal, exception, signal, the
# overall deadline, atexit) can kill all of them.
CHILDREN = []
CHILDREN_LOCK = threading.Lock()

try:
    import ctypes
    _LIBC = ctypes.CDLL(None, use_errno=True)
except (ImportError, OSError):
    _LIBC = None


def _die_with_parent():
    """In the child, before exec: SIGKILL when this script dies, even by
    SIGKILL (prctl PR_SET_PDEATHSIG; children are spawned from the main
    thread, whose exit is the process's)."""
    if _LIBC is not None:
        try:
            _LIBC.prctl(1, int(signal.SIGKILL), 0, 0, 0)
        except Exception:
            pass


def spawn(cmd, **kw):
    kw.setdefault("start_new_session", True)
    if threading.current_thread() is threading.main_thread():
        kw.setdefault("preexec_fn", _die_with_parent)
    p = subprocess.Popen(cmd, **kw)
    with CHILDREN_LOCK:
        CHILDREN.append(p)
    return p


def kill_all(grace=0.0):
    """SIGCONT (a stalled node would not act on SIGTERM) and SIGTERM every
    child's process group, then SIGKILL whatever is left after `grace` s;
    waits up to 5 s for them to go."""
    with CHILDREN_LOCK:
        procs = list(CHILDREN)
    live = [p for p in procs if p.poll() is None]
    sigs = [signal.SIGCONT, signal.SIGTERM] if grace > 0 else [signal.SIGCONT, signal.SIGKILL]
    for p in live:
        for sig in sigs:
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
    if grace > 0:
        end = time.time() + grace
        while time.time() < end and any(p.poll() is None for p in live):
            time.sleep(0.05)
        for p in live:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
    end = time.time() + 5
    while time.time() < end and any(p.poll() is None for p in live):
        time.sleep(0.05)
    return [p.pid for p in live if p.poll() is None]


def configmap_files(path=CONFIGMAP):
    """The ConfigMap's data entries ({name: text}), read by indentation (the
    file is YAML with `name: |` block scalars; no YAML parser in stdlib)."""
    files, name, lines, indent = {}, None, [], None
    in_data = False
    for raw in open(path).read().splitlines():
        if raw.startswith("data:"):
            in_data = True
            continue
        if not in_data:
            continue
        m = re.match(r"^  ([A-Za-z0-9_.-]+): \|\s*$", raw)
        if m:
            if name:
                files[name] = "\n".join(lines) + "\n"
            name, lines, indent = m.group(1), [], None
            continue
        if name is None:
            continue
        if raw.strip() == "":
            lines.append("")
            continue
        if indent is None:
            indent = len(raw) - len(raw.lstrip())
        if len(raw) - len(raw.lstrip()) < indent:
            break
        lines.append(raw[indent:])
    if name:
        files[name] = "\n".join(lines).rstrip("\n") + "\n"
    return files


def node_config(template, seeds, secret_file, rules_dir, gossip_addr):
    """The ConfigMap's sluice.toml with what a pod gets from its mounts and
    Service replaced: seeds (the first three nodes), the secret file, the
    rules directory, and this node's gossip address."""
    out = []
    for line in template.splitlines():
        s = line.strip()
        if s.startswith("seeds ="):
            line = "seeds = [" + ", ".join(f'"{a}"' for a in seeds) + "]"
        elif s.startswith("secret_file ="):
            line = f'secret_file = "{secret_file}"'
        elif s.startswith("rules_path ="):
            line = f'rules_path = "{rules_dir}"'
        out.append(line)
        if s == "[cluster]":
            out.append(f'gossip_addr = "{gossip_addr}"')
    return "\n".join(out) + "\n"


def cluster_settings(template):
    """The [cluster] table's lines, for the summary."""
    got, on = {}, False
    for line in template.splitlines():
        s = line.strip()
        if s.startswith("["):
            on = s == "[cluster]"
            continue
        if on and "=" in s and not s.startswith("#"):
            k, v = s.split("=", 1)
            got[k.strip()] = v.strip().strip('"')
    return got


class Fleet:
    def __init__(self, args, workdir):
        self.args, self.dir = args, workdir
        self.nodes = []  # dicts: id, proc, grpc, http, admin, gossip, log
        self.busy = []
        self.started = None

    def start_busy(self, k):
        for _ in range(k):
            self.busy.append(spawn(
                ["sh", "-c", "while :; do :; done"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def start_nodes(self, n, rng):
        files = configmap_files()
        template = files["sluice.toml"]
        self.settings = cluster_settings(template)
        rules_dir = os.path.join(self.dir, "rules")
        os.makedirs(rules_dir)
        with open(os.path.join(rules_dir, "rules.yaml"), "w") as f:
            f.write(files.get("rules.yaml", ""))
        secret_file = os.path.join(self.dir, "secret")
        with open(secret_file, "w") as f:
            f.write(SECRET)
        os.chmod(secret_file, 0o600)
        tcp = free_ports(3 * n)
        udp = free_ports(n)
        gossip = [f"127.0.0.1:{p}" for p in udp]
        seeds = gossip[:3]
        # The seeds first, then the rest in an order drawn from --seed.
        rest = list(range(3, n))
        rng.shuffle(rest)
        order = [0, 1, 2] + rest
        self.started = time.time()
        for i in order:
            home = os.path.join(self.dir, f"node-{i:02d}")
            os.makedirs(home)
            cfg = os.path.join(home, "sluice.toml")
            with open(cfg, "w") as f:
                f.write(node_config(template, seeds, secret_file, rules_dir, gossip[i]))
            node = {
                "id": f"stress-{i:02d}",
                "grpc": f"127.0.0.1:{tcp[3 * i]}",
                "http": f"127.0.0.1:{tcp[3 * i + 1]}",
                "admin": f"127.0.0.1:{tcp[3 * i + 2]}",
                "gossip": gossip[i],
                "log": os.path.join(home, "log"),
            }
            env = dict(os.environ, RUST_LOG="info", NO_COLOR="1",
                       SLUICE_ADMIN__TOKEN=TOKEN)
            for k in list(env):
                if k.startswith("SLUICE_") and k not in ("SLUICE_ADMIN__TOKEN",):
                    del env[k]
            logf = open(node["log"], "wb")
            node["proc"] = spawn(
                [self.args.bin, "serve", "--config", cfg, "--node-id", node["id"],
                 "--grpc-addr", node["grpc"], "--http-addr", node["http"],
                 "--admin-addr", node["admin"], "--log-format", "json"],
                cwd=home, env=env, stdin=subprocess.DEVNULL, stdout=logf,
                stderr=subprocess.STDOUT)
            logf.close()
            self.nodes.append(node)
        self.spawned = time.time() - self.started

    def stop(self):
        kill_all(grace=5.0)


def get(url, token=None, timeout=3.0):
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except Exception:
        return None, b""


def sample_node(node):
    """One node's standing: its ring (node ids in it), view, N, transfer,
    readiness; None fields when it did not answer in time."""
    out = {"id": node["id"], "alive": node["proc"].poll() is None}
    code, body = get(f"http://{node['admin']}/status", TOKEN)
    if code == 200:
        try:
            s = json.loads(body)
            ring = sorted(m["node_id"] for m in s["members"] if m["in_ring"])
            out.update(
                ring=ring, view=s.get("view"), size=s.get("cluster_size"),
                minority=s.get("minority"), members=len(s["members"]),
                generation=next((m["generation"] for m in s["members"] if m.get("is_self")), None),
                transfer_complete=s.get("transfer", {}).get("complete"),
                transfer_pending=sum(1 for t in s.get("transfer", {}).get("sources", [])
                                     if t.get("standing") in ("pending", "stalled")))
        except (ValueError, KeyError, TypeError):
            pass
    code, _ = get(f"http://{node['http']}/readyz")
    out["ready"] = code == 200 if code is not None else None
    return out


def sample(fleet, pool):
    return list(pool.map(sample_node, fleet.nodes))


def one_ring(samples, n):
    ids = sorted(s["id"] for s in samples)
    return all(s.get("ring") == ids for s in samples) and len(ids) == n


def gossip_metrics(fleet, pool):
    """Sums of every /metrics series whose name mentions gossip, per node."""
    def read(node):
        try:
            text = metrics(node["http"])
        except Exception:
            return None
        got = {}
        for line in text.splitlines():
            if line.startswith("#") or "gossip" not in line.split(" ")[0].split("{")[0]:
                continue
            name = line.split("{")[0].split(" ")[0]
            try:
                got[name] = got.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
        return got
    return list(pool.map(read, fleet.nodes))


def udp_counters():
    """Host-wide (this network namespace) UDP counters and loopback bytes:
    datagrams out/in, receive-buffer drops, lo bytes sent."""
    got = {}
    try:
        rows = [l.split() for l in open("/proc/net/snmp") if l.startswith("Udp:")]
        got = {k: int(v) for k, v in zip(rows[0][1:], rows[1][1:])}
    except (OSError, IndexError, ValueError):
        pass
    try:
        for line in open("/proc/net/dev"):
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                got["lo_tx_bytes"] = int(rest.split()[8])
    except (OSError, IndexError, ValueError):
        pass
    return got


def strace_udp(pids, seconds):
    """Gossip bytes per node: every sendto() of each node (chitchat's UDP
    sends; gRPC writes to TCP with write/writev) for `seconds`, by strace
    attached to all its threads. Perturbs the traced nodes a little while it
    runs (ptrace); run after the final sample. None without strace."""
    exe = shutil.which("strace")
    if not exe or not pids:
        return None
    outs, procs = [], []
    for pid in pids:
        fd, path = tempfile.mkstemp(prefix="fleet-strace-")
        os.close(fd)
        outs.append(path)
        procs.append(spawn(
            [exe, "-f", "-qq", "-s", "0", "-e", "trace=sendto,sendmsg,sendmmsg", "-o", path,
             "-p", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        time.sleep(seconds)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
    sizes = []
    for path in outs:
        node = []
        for line in open(path, errors="replace"):
            m = re.search(r"^(?:\d+\s+)?sendto\(.*\)\s+=\s+(\d+)\s*$", line)
            if m:
                node.append(int(m.group(1)))
        os.unlink(path)
        sizes.append(node)
    flat = [x for n in sizes for x in n]
    if not flat:
        return {"nodes_traced": len(pids), "seconds": seconds, "datagrams": 0}
    flat.sort()
    return {
        "nodes_traced": len(pids), "seconds": seconds,
        "bytes_per_node_s": round(sum(flat) / len(pids) / seconds),
        "datagrams_per_node_s": round(len(flat) / len(pids) / seconds, 1),
        "datagram_bytes_mean": round(sum(flat) / len(flat)),
        "datagram_bytes_p99": flat[min(len(flat) - 1, int(0.99 * len(flat)))],
        "datagram_bytes_max": flat[-1],
    }


def scan_logs(fleet):
    counts = collections.Counter()
    reasons = collections.Counter()
    aways = []
    first_rejoin = None
    examples = collections.OrderedDict()
    per_node_rejoins = {}
    per_node_too_large = {}
    for node in fleet.nodes:
        rejoins = 0
        try:
            lines = open(node["log"], errors="replace").read().splitlines()
        except OSError:
            continue
        for line in lines:
            for key, needle in WATCH.items():
                if needle in line:
                    counts[key] += 1
                    if key == "datagram_too_large":
                        per_node_too_large[node["id"]] = per_node_too_large.get(node["id"], 0) + 1
                    if key not in examples:
                        examples[key] = f"{node['id']}: {line[:400]}"
            if REJOIN in line or "this node was away" in line:
                try:
                    obj = json.loads(line)
                except ValueError:
                    obj = {}
                fields = obj.get("fields", obj)
                if REJOIN in line:
                    rejoins += 1
                    reasons[fields.get("why", "?")] += 1
                    ts = obj.get("timestamp")
                    if ts and (first_rejoin is None or ts < first_rejoin):
                        first_rejoin = ts
                else:
                    m = re.search(r"([\d.]+)(ms|s|µs)", str(fields.get("away", "")))
                    if m:
                        scale = {"ms": 1e-3, "s": 1.0, "µs": 1e-6}[m.group(2)]
                        aways.append(float(m.group(1)) * scale)
            if '"level":"ERROR"' in line and "errors" not in examples:
                examples["errors"] = f"{node['id']}: {line[:400]}"
        per_node_rejoins[node["id"]] = rejoins
    return {
        "counts": dict(counts),
        "rejoin_reasons": dict(reasons),
        "nodes_rejoined": sum(1 for v in per_node_rejoins.values() if v),
        "max_rejoins_one_node": max(per_node_rejoins.values(), default=0),
        "first_rejoin_at": first_rejoin,
        "away_s": ({"n": len(aways), "min": round(min(aways), 3), "max": round(max(aways), 3),
                    "median": round(sorted(aways)[len(aways) // 2], 3)} if aways else None),
        "examples": examples,
        "per_node_rejoins": per_node_rejoins,
        "per_node_too_large": per_node_too_large,
    }


# --stall: what a stopped node's peers and its own log say. /status shows,
# per member: whether it is listed at all (a buried generation is left out
# of every view; so is a suspected member that was not ready), in_ring, its
# generation, this node's breaker for it, and whether this node suspects it
# (chitchat's failure detector declares it dead; it keeps its place in the
# ring until a majority buries it).
STALL_LOG = ("away", "fenced", "cut off", "back from away", "rejoin", "suspected by",
             "no majority heard", "declared dead", "majority of the cluster lost")


def status_of(node, timeout):
    code, body = get(f"http://{node['admin']}/status", TOKEN, timeout=timeout)
    if code != 200:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def parse_stall(arg_list):
    out = []
    for a in arg_list or []:
        for part in str(a).split(","):
            if part.strip():
                v = float(part)
                if v <= 0:
                    raise argparse.ArgumentTypeError("--stall seconds must be > 0")
                out.append(v)
    return out


def log_lines_since(path, offset, needles=STALL_LOG, limit=12):
    """The stalled node's lines after `offset` whose message mentions one of
    `needles`, compacted: time, level, message, other fields."""
    got = []
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return got, []
    rejoin_reasons = []
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            obj = {"fields": {"message": line}}
        fields = dict(obj.get("fields", {}))
        msg = str(fields.pop("message", ""))
        if not any(n in msg.lower() for n in needles):
            continue
        if REJOIN in msg:
            rejoin_reasons.append(fields.get("why", "?"))
        ts = str(obj.get("timestamp", ""))[11:23]
        extra = " ".join(f"{k}={v}" for k, v in fields.items())
        got.append(f"{ts} {obj.get('level', '')} {msg}" + (f" [{extra}]" if extra else ""))
    if len(got) > limit:
        got = got[: limit // 2] + [f"... {len(got) - limit} more ..."] + got[-limit // 2:]
    return got, rejoin_reasons


def stall_one(fleet, pool, target, seconds, heal_deadline=20.0, hold=3.0, step=0.25):
    """SIGSTOP `target` for `seconds`, SIGCONT it, and sample every node's
    /status every `step` s (the others while it is stopped, all after)
    until the fleet has been one ring of N for `hold` s (at least `hold` s
    after SIGCONT), or `heal_deadline` + `hold` s after SIGCONT (a streak
    starting by `heal_deadline` can still hold)."""
    n = len(fleet.nodes)
    ids = sorted(nd["id"] for nd in fleet.nodes)
    tid = target["id"]
    others = [nd for nd in fleet.nodes if nd is not target]
    before = status_of(target, 3.0)
    gen0 = next((m["generation"] for m in (before or {}).get("members", [])
                 if m.get("is_self")), None)
    try:
        offset = os.path.getsize(target["log"])
    except OSError:
        offset = 0
    seen = {k: {} for k in ("missing", "out_of_ring", "other_generation", "breaker_open",
                            "suspecting")}
    times = {}

    def stopper():
        times["stop"] = time.time()
        os.killpg(target["proc"].pid, signal.SIGSTOP)
        time.sleep(seconds)
        os.killpg(target["proc"].pid, signal.SIGCONT)
        times["cont"] = time.time()

    th = threading.Thread(target=stopper, daemon=True)
    th.start()
    while "stop" not in times:
        time.sleep(0.001)
    t_stop = times["stop"]
    sweeps, broke_at, streak_from, healed_at, gen_after, ready_after = 0, None, None, None, None, None
    others_one_ring_during = True
    while True:
        t0 = time.time()
        stopped = th.is_alive()
        who = others if stopped else fleet.nodes
        res = list(pool.map(lambda nd: (nd, status_of(nd, 1.0 if stopped else 2.0)), who))
        sweeps += 1
        at = round(t0 - t_stop, 2)
        rings_ok = True
        for nd, st in res:
            if st is None:
                rings_ok = False
                continue
            ring = sorted(m["node_id"] for m in st.get("members", []) if m.get("in_ring"))
            if ring != ids:
                rings_ok = False
            if nd is target:
                # Only answers after SIGCONT (it answers nothing while stopped).
                gen_after = next((m["generation"] for m in st["members"] if m.get("is_self")),
                                 gen_after)
                continue
            m = next((m for m in st.get("members", []) if m["node_id"] == tid), None)
            marks = []
            if m is None:
                marks.append("missing")
            else:
                if not m.get("in_ring"):
                    marks.append("out_of_ring")
                if gen0 is not None and m.get("generation") != gen0:
                    marks.append("other_generation")
                if m.get("breaker") in ("open", "half-open"):
                    marks.append("breaker_open")
                if m.get("suspected"):
                    marks.append("suspecting")
            for k in marks:
                seen[k].setdefault(nd["id"], at)
        whole = rings_ok and not stopped and len(res) == n
        if stopped and not rings_ok:
            others_one_ring_during = False
        if not whole and broke_at is None and (not stopped or not rings_ok):
            broke_at = at
        if whole:
            streak_from = streak_from if streak_from is not None else t0
        else:
            streak_from = None
        if not stopped:
            since_cont = time.time() - times["cont"]
            if streak_from is not None and time.time() - streak_from >= hold and since_cont >= hold:
                healed_at = streak_from
                break
            if since_cont >= heal_deadline + hold or (
                    streak_from is None and since_cont >= heal_deadline):
                break
        time.sleep(max(0.0, step - (time.time() - t0)))
    th.join()
    code, _ = get(f"http://{target['http']}/readyz")
    ready_after = code == 200
    time.sleep(0.5)  # let the log catch up
    lines, reasons = log_lines_since(target["log"], offset)
    t_cont = times["cont"]
    return {
        "node": tid, "stall_s": seconds,
        "stopped_for_s": round(t_cont - t_stop, 3),
        "generation_before": gen0, "generation_after": gen_after,
        "rejoined": (gen_after is not None and gen_after != gen0) or bool(reasons),
        "rejoins_logged": len(reasons), "rejoin_reasons": reasons,
        "peers_missing_it": len(seen["missing"]),
        "peers_missing_ids": sorted(seen["missing"]),
        "peers_out_of_ring": len(seen["out_of_ring"]),
        "peers_other_generation": len(seen["other_generation"]),
        "peers_breaker_open": len(seen["breaker_open"]),
        # Peers whose failure detector declared it dead (a burial needs a
        # majority of them), and when the first and the median one did.
        "peers_suspecting": len(seen["suspecting"]),
        "suspected_at_s": sorted(seen["suspecting"].values())[:1] + sorted(
            seen["suspecting"].values())[len(seen["suspecting"]) // 2:][:1],
        "first_missing_at_s": min(seen["missing"].values(), default=None),
        "others_one_ring_while_stopped": others_one_ring_during,
        "one_ring_of_n_broken_at_s": broke_at,
        "heal_s_after_cont": (round(max(0.0, healed_at - t_cont), 2)
                              if healed_at is not None else "not within %gs" % heal_deadline),
        "ready_after": ready_after,
        "sweeps": sweeps,
        "sweep_interval_s": round((time.time() - t_stop) / max(1, sweeps), 3),
        "log": lines,
        "log_offset": offset,
    }


def run_stalls(fleet, stalls, rng):
    """Each stall on a node other than the three seeds (a different one per
    stall while there are enough), 5 s apart."""
    candidates = fleet.nodes[3:]
    picks = rng.sample(candidates, min(len(stalls), len(candidates)))
    out = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        for i, secs in enumerate(stalls):
            if i:
                time.sleep(5.0)
            target = picks[i % len(picks)]
            if target["proc"].poll() is not None:
                out.append({"node": target["id"], "stall_s": secs, "skipped": "node exited"})
                continue
            out.append(stall_one(fleet, pool, target, secs))
            print("# stall: " + json.dumps(out[-1]), file=sys.stderr, flush=True)
    return out


def run(args, workdir):
    rng = random.Random(args.seed)
    fleet = Fleet(args, workdir)
    timeline = []
    loads = []
    try:
        udp_before = udp_counters()
        fleet.start_busy(args.busy)
        fleet.start_nodes(args.nodes, rng)
        n = args.nodes
        formed_at, ready_all_at, splits_after = None, None, 0
        stalls = None  # --stall: run once, when the fleet first settles
        stalls_at = None
        first_ready_at = None
        first_gen = {}  # node id -> the first generation it reported for itself
        end = fleet.started + args.seconds
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            while time.time() < end:
                t0 = time.time()
                samples = sample(fleet, pool)
                at = round(time.time() - fleet.started, 2)  # by then, all had answered
                rings = collections.Counter(tuple(s["ring"]) for s in samples if "ring" in s)
                ok = one_ring(samples, n)
                for s in samples:
                    if s.get("generation") is not None:
                        first_gen.setdefault(s["id"], s["generation"])
                ready = sum(1 for s in samples if s.get("ready"))
                if ok and formed_at is None:
                    formed_at = at
                elif not ok and formed_at is not None:
                    splits_after += 1
                if ready == n and ready_all_at is None:
                    ready_all_at = at
                if ready and first_ready_at is None:
                    first_ready_at = at
                loads.append(os.getloadavg()[0])
                timeline.append({
                    "t": at, "answered": sum(1 for s in samples if "ring" in s),
                    "rings": len(rings), "largest": max((len(r) for r in rings), default=0),
                    "ready": ready, "one_ring": ok,
                })
                if args.verbose:
                    print(json.dumps(timeline[-1]), file=sys.stderr, flush=True)
                # Finer until the fleet first forms (the formation time's
                # resolution), then every --interval.
                step = args.interval if formed_at is not None else min(args.interval, 0.5)
                # Stalls once the fleet has settled: one ring of N, every
                # node ready. Before that no majority of ready members can
                # vote a burial — no one could take a stalled node's keys
                # either — so a long stall goes unburied by design.
                if ok and ready == n and args.stall and stalls is None:
                    stalls_at = at
                    stalls = run_stalls(fleet, args.stall, random.Random(args.seed + 1))
                    continue
                time.sleep(max(0.0, min(step - (time.time() - t0), end - time.time())))
            elapsed = time.time() - fleet.started
            cpu = sum(cpu_seconds(nd["proc"].pid) for nd in fleet.nodes
                      if nd["proc"].poll() is None)
            final = sample(fleet, pool)
            gm = gossip_metrics(fleet, pool)
        udp_after = udp_counters()
        udp = {k: udp_after[k] - udp_before.get(k, 0) for k in
               ("OutDatagrams", "InDatagrams", "RcvbufErrors", "InErrors", "lo_tx_bytes")
               if k in udp_after}
        traced = [nd["proc"].pid for nd in (fleet.nodes[0], fleet.nodes[-1])
                  if nd["proc"].poll() is None]
        straced = strace_udp(traced, args.strace_seconds) if args.strace_seconds > 0 else None
        rings = collections.Counter(tuple(s["ring"]) for s in final if "ring" in s)
        # Which ring each node is in; a ring is "a cluster" as a member set.
        ring_list = sorted(rings.items(), key=lambda kv: (-len(kv[0]), -kv[1]))
        views = [s["view"] for s in final if s.get("view") is not None]
        sizes = [s["size"] for s in final if s.get("size") is not None]
        gossip_names = sorted({k for g in gm if g for k in g})
        gossip_rate = None
        if gossip_names:
            byte_names = [k for k in gossip_names if "byte" in k]
            if byte_names:
                tot = sum(g.get(k, 0.0) for g in gm if g for k in byte_names)
                gossip_rate = round(tot / n / elapsed, 1)
        logs = scan_logs(fleet)
        stalled = {x["node"] for x in (stalls or [])}
        final_by_id = {s["id"]: s for s in final}
        by_id = {nd["id"]: nd for nd in fleet.nodes}
        for x in stalls or []:
            # What the stalled node did by the end of the run: its rejoins
            # since the stall began and its generation in the final sample.
            if "log_offset" in x:
                _, reasons = log_lines_since(by_id[x["node"]]["log"], x.pop("log_offset"))
                x["rejoins_by_end"] = len(reasons)
                x["generation_end"] = final_by_id.get(x["node"], {}).get("generation")
        ids = sorted(nd["id"] for nd in fleet.nodes)
        summary = {
            "nodes": n, "seconds": args.seconds, "busy": args.busy, "seed": args.seed,
            "cpus": os.cpu_count(),
            "settings": {k: v for k, v in fleet.settings.items()
                         if k not in ("seeds", "secret_file")},
            "spawn_s": round(fleet.spawned, 2),
            "formation_s": formed_at if formed_at is not None else "never",
            "all_ready_s": ready_all_at if ready_all_at is not None else "never",
            "first_ready_s": first_ready_at,
            "samples": len(timeline), "samples_split_after_formation": splits_after,
            "final": {
                "answered": sum(1 for s in final if "ring" in s),
                "alive": sum(1 for s in final if s["alive"]),
                "distinct_rings": len(rings),
                "ring_sizes": [len(r) for r, _ in ring_list],
                "nodes_per_ring": [c for _, c in ring_list],
                "one_ring_of_n": one_ring(final, n),
                "ready": sum(1 for s in final if s.get("ready")),
                "minority": sum(1 for s in final if s.get("minority")),
                "transfer_complete": sum(1 for s in final if s.get("transfer_complete")),
                "transfer_pending_sources": sum(s.get("transfer_pending", 0) for s in final),
                "view_min": min(views, default=None), "view_max": max(views, default=None),
                "cluster_size_min": min(sizes, default=None),
                "cluster_size_max": max(sizes, default=None),
            },
            "rejoins": logs["counts"].get("rejoins", 0),
            "rejoins_of_unstalled_nodes": sum(
                v for k, v in logs["per_node_rejoins"].items() if k not in stalled),
            "stalls": (stalls if stalls is not None
                       else ("never settled (one ring of N, all ready): none run"
                             if args.stall else None)),
            "stalls_started_s": stalls_at,
            "rejoin_reasons": logs["rejoin_reasons"],
            "nodes_rejoined": logs["nodes_rejoined"],
            "max_rejoins_one_node": logs["max_rejoins_one_node"],
            "datagram_too_large": logs["counts"].get("datagram_too_large", 0),
            "log_counts": logs["counts"], "away_s": logs["away_s"],
            "gossip_metrics": gossip_names or None,
            "gossip_bytes_per_node_s": gossip_rate,
            "gossip_sendto_strace": straced,
            "udp_host_per_node_s": {k: round(v / n / elapsed, 1) for k, v in udp.items()},
            "udp_rcvbuf_drops": udp.get("RcvbufErrors"),
            "node_cpu_s_per_s": round(cpu / elapsed, 2),
            "load_avg_max": round(max(loads, default=0.0), 1),
            "load_avg_end": round(os.getloadavg()[0], 1),
            "timeline": [(x["t"], x["rings"], x["largest"], x["ready"]) for x in timeline[::max(1, len(timeline) // 12)]],
            "logs": workdir,
        }
        facts = {
            "ids": ids, "final": final, "stalled": stalled, "first_gen": first_gen,
            "per_node_rejoins": logs["per_node_rejoins"],
            "per_node_too_large": logs["per_node_too_large"],
        }
        return summary, logs["examples"], facts
    finally:
        fleet.stop()


FORM_WITHIN_S = 30.0   # --check: one ring of N on every node within this
HEAL_WITHIN_S = 20.0   # --check: after a long stall's SIGCONT, one ring of N again
SHORT_STALL_S = 1.0    # --check: stalls up to this long must go unnoticed
LONG_STALL_S = 5.0     # --check: stalls this long or longer must rejoin once
DEADLINE_SLACK_S = 120.0


def check(args, summary, facts):
    """--check: one line per failed condition (empty: all hold)."""
    fails = []
    n, ids = args.nodes, facts["ids"]
    formed = summary["formation_s"]
    if formed == "never":
        fails.append(f"formation: no sample showed one ring of {n} on every node "
                     f"in {args.seconds:g} s (limit {FORM_WITHIN_S:g} s)")
    elif formed > FORM_WITHIN_S:
        fails.append(f"formation: one ring of {n} on every node at {formed} s "
                     f"(limit {FORM_WITHIN_S:g} s)")
    for s in facts["final"]:
        if not s.get("alive"):
            fails.append(f"final: {s['id']} exited")
        if s.get("ready") is not True:
            fails.append(f"final: {s['id']} not ready (/readyz "
                         f"{'no answer' if s.get('ready') is None else 'not 200'})")
        ring = s.get("ring")
        if ring is None:
            fails.append(f"final: {s['id']} /status did not answer")
        elif ring != ids:
            missing = sorted(set(ids) - set(ring))
            extra = sorted(set(ring) - set(ids))
            fails.append(f"final: {s['id']} ring has {len(ring)} members, not the {n}"
                         + (f"; lacks {','.join(missing)}" if missing else "")
                         + (f"; extra {','.join(extra)}" if extra else ""))
    for node, c in sorted(facts["per_node_too_large"].items()):
        if c:
            fails.append(f"datagram_too_large: {node} logged {c} \"{TOO_LARGE}\" line(s)")
    final_by_id = {s["id"]: s for s in facts["final"]}
    for node in ids:
        if node in facts["stalled"]:
            continue
        c = facts["per_node_rejoins"].get(node, 0)
        if c:
            fails.append(f"rejoins: {node} (not stalled) rejoined {c} time(s)")
        g0, g1 = facts["first_gen"].get(node), final_by_id.get(node, {}).get("generation")
        if not c and g0 is not None and g1 is not None and g1 != g0:
            fails.append(f"rejoins: {node} (not stalled) generation {g0} -> {g1}")
    stalls = summary["stalls"]
    if args.stall and not isinstance(stalls, list):
        fails.append(f"stalls: none run ({stalls})")
        stalls = []
    for x in stalls or []:
        node, secs = x["node"], x["stall_s"]
        tag = f"stall {secs:g}s: {node}"
        if "skipped" in x:
            fails.append(f"{tag} not stalled ({x['skipped']})")
            continue
        if secs <= SHORT_STALL_S:
            g0, g1, ge = x["generation_before"], x["generation_after"], x.get("generation_end")
            if g0 is None:
                fails.append(f"{tag} generation before the stall unknown (/status did not answer)")
            elif g1 is None:
                fails.append(f"{tag} /status did not answer after SIGCONT (generation unknown)")
            elif g1 != g0:
                fails.append(f"{tag} generation {g0} -> {g1} after SIGCONT")
            elif ge is not None and ge != g0:
                fails.append(f"{tag} generation {g0} -> {ge} by the end of the run")
            if x.get("rejoins_by_end"):
                fails.append(f"{tag} rejoined {x['rejoins_by_end']} time(s)")
            if x["peers_missing_it"]:
                fails.append(f"{tag} left out of {x['peers_missing_it']} peer(s)' members "
                             f"(first at {x['first_missing_at_s']} s after SIGSTOP: "
                             f"{','.join(x['peers_missing_ids'][:8])}"
                             f"{',...' if x['peers_missing_it'] > 8 else ''})")
        if secs >= LONG_STALL_S:
            r = x.get("rejoins_by_end", x["rejoins_logged"])
            if r != 1:
                fails.append(f"{tag} rejoined {r} time(s), not exactly once")
            heal = x["heal_s_after_cont"]
            if not isinstance(heal, (int, float)) or heal > HEAL_WITHIN_S:
                fails.append(f"{tag} fleet not one ring of {n} within {HEAL_WITHIN_S:g} s "
                             f"of SIGCONT (heal: {heal})")
    return fails


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=40)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--busy", type=int, default=0, help="CPU busy-loop processes beside the nodes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "target", "release", "sluice"),
                    help="the sluice binary (default: this checkout's target/release/sluice; "
                         "a copy elsewhere keeps a rebuild from swapping it mid-run)")
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between samples")
    ap.add_argument("--keep", action="store_true", help="keep the logs directory")
    ap.add_argument("--strace-seconds", type=float, default=5.0,
                    help="after the run, strace two nodes' sendto() this long for gossip "
                         "bytes (0: off)")
    ap.add_argument("--verbose", action="store_true", help="each sample on stderr")
    ap.add_argument("--check", action="store_true",
                    help="exit 1, one stderr line per failed condition, unless: one ring of N "
                         "within 30 s; at the end every node ready in the same ring of N; no "
                         "'gossip datagram too large'; no rejoins but of stalled nodes; stalls "
                         "<= 1 s unnoticed (same generation, no peer leaves it out); stalls >= "
                         "5 s rejoin exactly once and one ring of N within 20 s of SIGCONT. "
                         "Also: past --seconds + 120 s everything is killed and the run fails")
    ap.add_argument("--stall", action="append", metavar="SECONDS",
                    help="once the fleet first forms, SIGSTOP a node (not a seed) this long, "
                         "SIGCONT it and wait up to 20 s for one ring of N; repeatable or a "
                         "comma list (1,5), 5 s apart, each on another node")
    args = ap.parse_args()
    try:
        args.stall = parse_stall(args.stall)
    except (ValueError, argparse.ArgumentTypeError) as e:
        ap.error(f"--stall: {e}")
    if args.nodes < 3:
        sys.exit("--nodes must be at least 3 (three seeds)")
    # Nodes start in their own directories: a relative path must not move.
    args.bin = os.path.abspath(args.bin)
    if not os.access(args.bin, os.X_OK):
        sys.exit(f"no executable at {args.bin}")

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    workdir = tempfile.mkdtemp(prefix="fleet-stress-")
    atexit.register(kill_all)

    # The overall deadline: past --seconds + 120 s, whatever the run is
    # waiting on, kill every child and fail (the logs stay). Written with
    # os.write and left with os._exit: the main thread may hold any lock.
    limit = args.seconds + DEADLINE_SLACK_S

    def expire():
        os.write(2, (f"FAIL deadline: run not finished within {limit:g} s (--seconds "
                     f"{args.seconds:g} + {DEADLINE_SLACK_S:g} s); killing every child\n").encode())
        left = kill_all()
        if left:
            os.write(2, f"# still alive after SIGKILL: {left}\n".encode())
        os.write(1, (json.dumps({"nodes": args.nodes, "seconds": args.seconds,
                                 "deadline_exceeded_s": limit, "logs": workdir}) + "\n").encode())
        os.write(2, f"# logs: {workdir}/node-NN/log\n".encode())
        os._exit(1)

    watchdog = threading.Timer(limit, expire)
    watchdog.daemon = True
    watchdog.start()

    keep = args.keep
    failed = []
    try:
        summary, examples, facts = run(args, workdir)
        for key, line in examples.items():
            print(f"# {key}: {line}", file=sys.stderr)
        if args.check:
            failed = check(args, summary, facts)
            summary["check"] = {"passed": not failed, "failed": len(failed)}
        keep = (keep or not summary["final"]["one_ring_of_n"] or summary["rejoins"] > 0
                or bool(args.stall) or bool(failed))
        if not keep:
            summary["logs"] = None
        print(json.dumps(summary), flush=True)
        for line in failed:
            print(f"FAIL {line}", file=sys.stderr)
        if failed:
            print(f"# check failed: {len(failed)} condition(s); logs in {workdir}",
                  file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        keep = True
        print(f"interrupted; logs in {workdir}", file=sys.stderr)
        sys.exit(130)
    except BaseException:
        keep = True
        print(f"failed; logs in {workdir}", file=sys.stderr)
        raise
    finally:
        watchdog.cancel()
        kill_all()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
        # Last line: where the nodes' logs are (node-NN/log), or that they
        # went (a clean run without --keep).
        print(f"# logs: {workdir}/node-NN/log" if keep
              else f"# logs: removed ({workdir}; pass --keep to keep them)",
              file=sys.stderr, flush=True)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
