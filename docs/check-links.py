#!/usr/bin/env python3
"""Check the links of the README, the benchmarks' README and history, and
the book (docs/src): every relative
link names a file that exists, every #anchor a heading of its target, every
chapter is in SUMMARY.md and every SUMMARY entry exists. Exits 1 naming
each broken link. (The book's own build, mdBook, does not check links.)"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading):
    """A heading's anchor as GitHub and mdBook make it."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def outside_fences(text):
    fence = False
    for line in text.split("\n"):
        if line.startswith("```"):
            fence = not fence
            continue
        if not fence:
            yield line


def anchors(path):
    with open(path, encoding="utf-8") as f:
        return {slug(m.group(1)) for line in outside_fences(f.read())
                if (m := re.match(r"^#+ (.*)", line))}


def check(path, errors):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for line in outside_fences(text):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z]+:", target):
                continue  # http(s), mailto: not checked here (no network in CI)
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            rel = os.path.relpath(path, ROOT)
            if not os.path.exists(dest):
                errors.append(f"{rel}: {target}: no such file")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                errors.append(f"{rel}: {target}: no heading #{anchor}")


def main():
    errors = []
    src = os.path.join(ROOT, "docs", "src")
    files = [os.path.join(ROOT, p) for p in ("README.md", "benches/README.md", "benches/HISTORY.md")]
    files += sorted(os.path.join(src, f) for f in os.listdir(src) if f.endswith(".md"))
    for f in files:
        check(f, errors)
    with open(os.path.join(src, "SUMMARY.md"), encoding="utf-8") as f:
        listed = set(LINK.findall(f.read()))
    for f in os.listdir(src):
        if f.endswith(".md") and f != "SUMMARY.md" and f not in listed:
            errors.append(f"docs/src/{f}: not in SUMMARY.md")
    for e in errors:
        print(e)
    print(f"{len(files)} files, {len(errors)} broken links")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
