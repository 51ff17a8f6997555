#!/usr/bin/env python3
"""The status page in a real browser: Debian's chromium, headless, against a
real 3-node cluster of `sluice serve` processes.

One key is refused (`sluice check` past its limit); the test finds the node
whose /status ranks it (the key's owner, where it is decided), then loads
that node's page as a browser would log in — HTTP Basic credentials in the
URL (`http://operator:<token>@127.0.0.1:<admin port>/`) — and asserts by the
DOM chromium dumps after the page's own fetch of /status has filled it
(`--virtual-time-budget`): all three node ids, their ring shares as the
JSON gives them, and the refused key. A screenshot of the same page is
saved to docs/status.png (the book's API chapter shows it) when --screenshot is given;
without it (CI) the screenshot is only checked, not kept.

Headless chromium honours Basic credentials in a top-level URL, and the
page's fetch goes to `location.origin + "/status"` (a base URL with
credentials is refused by fetch) and carries the cached Basic credentials:
no token in a query string is needed, so none is accepted.

Usage: tests/status_browser.py [path/to/sluice]   (installs Debian's
`chromium` if it is not on PATH: needs root and apt)
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_cluster import LocalCluster  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCREENSHOT = os.path.join(ROOT, "docs", "status.png")
SECRET = "status-browser-secret"
TOKEN = "status-browser-admin-token-0123456789"
KEY = "abuser-203.0.113.7"


def await_(what, check, deadline, cluster=None):
    until = time.time() + deadline
    last = None
    while time.time() < until:
        gone = cluster.exited() if cluster else None
        if gone:
            raise SystemExit(f"FAIL: waiting for {what}: {gone}")
        try:
            got = check()
            if got:
                return got
        except Exception as e:  # a node not up yet
            last = e
        time.sleep(0.2)
    logs = cluster.log_tails() if cluster else ""
    raise SystemExit(f"FAIL: timed out waiting for {what} (last error: {last}){logs}")


def status(node):
    req = urllib.request.Request(f"http://{node['admin']}/status",
                                 headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=2) as r:
        return json.load(r)


def chromium():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    print("installing Debian's chromium", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"],
                   check=True, env=env)
    return shutil.which("chromium")


def browse(browser, url, *extra):
    profile = tempfile.mkdtemp(prefix="sluice-chromium-")
    try:
        r = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             f"--user-data-dir={profile}", "--virtual-time-budget=5000", *extra, url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120, text=True)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: chromium exited {r.returncode}: {r.stderr[-2000:]}")
    return r.stdout


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "release", "sluice")
    started = time.time()
    browser = chromium()
    print(f"chromium: {browser} ({time.time() - started:.0f} s)", flush=True)
    tmp = tempfile.mkdtemp(prefix="sluice-status-")
    cluster = LocalCluster(binary, tmp, SECRET)
    nodes = cluster.nodes
    try:
        cluster.start(3, token=TOKEN)
        ids = [n["id"] for n in nodes]
        await_("every node to see three members in its ring",
               lambda: all(sorted(m["node_id"] for m in status(n)["members"] if m["in_ring"]) == ids
                           for n in nodes), 30, cluster)
        # Refuse the key: limit 3, 6 checks.
        subprocess.run([binary, "check", "--addr", nodes[0]["grpc"], "--name", "api", "--key", KEY,
                        "--limit", "3", "--duration-ms", "600000", "-n", "6"],
                       check=True, stdout=subprocess.DEVNULL)

        def holder():
            for n in nodes:
                s = status(n)
                if any(k["key"] == KEY for k in s["top_by_refusals"]):
                    return n, s
            return None
        node, s = await_("a node to rank the refused key", holder, 15, cluster)
        # Some refusals decided through that node too, so its rates (by
        # status and path, counted where a check arrives) are not zero.
        subprocess.run([binary, "check", "--addr", node["grpc"], "--name", "api", "--key", KEY,
                        "--limit", "3", "--duration-ms", "600000", "-n", "4"],
                       check=True, stdout=subprocess.DEVNULL)
        shares = {m["node_id"]: f"{m['ring_share_pct']:.1f}%" for m in s["members"]}
        print(f"{node['id']} ranks {KEY}; shares {shares}", flush=True)

        host, port = node["admin"].split(":")
        url = f"http://operator:{TOKEN}@{host}:{port}/"
        t0 = time.time()
        dom = browse(browser, url, "--dump-dom")
        print(f"dump-dom: {time.time() - t0:.1f} s, {len(dom)} bytes", flush=True)
        missing = [x for x in [*ids, *shares.values(), KEY] if x not in dom]
        if missing:
            raise SystemExit(f"FAIL: not in the rendered DOM: {missing}\n{dom[:4000]}")
        if "status 401" in dom:
            raise SystemExit("FAIL: the page's fetch was refused")
        # Without credentials the page itself is refused.
        try:
            urllib.request.urlopen(f"http://{node['admin']}/", timeout=2)
            raise SystemExit("FAIL: the page answered without credentials")
        except urllib.error.HTTPError as e:
            assert e.code == 401, e.code
            assert 'Basic realm="sluice"' in e.headers.get("WWW-Authenticate", "")
        # Written where nothing was before (the committed docs/status.png
        # would pass any check made where it already is), then kept only
        # with --screenshot.
        shot = os.path.join(tmp, "status.png")
        browse(browser, url, f"--screenshot={shot}", "--window-size=1200,900",
               "--hide-scrollbars")
        if not os.path.exists(shot) or os.path.getsize(shot) < 10_000:
            raise SystemExit("FAIL: no screenshot")
        with open(shot, "rb") as f:
            if f.read(8) != b"\x89PNG\r\n\x1a\n":
                raise SystemExit("FAIL: the screenshot is not a PNG")
        if "--screenshot" in sys.argv:
            os.makedirs(os.path.dirname(SCREENSHOT), exist_ok=True)
            shutil.copyfile(shot, SCREENSHOT)
        print(f"OK: the status page renders all three members, their shares and the refused "
              f"key in chromium; screenshot checked"
              f"{' and kept at ' + os.path.relpath(SCREENSHOT, ROOT) if '--screenshot' in sys.argv else ''} "
              f"({time.time() - started:.0f} s)")
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
