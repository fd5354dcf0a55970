#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Writes the kernel files tools/intree.sh edits, into a staging directory.

    place.py PRISTINE STAGE SNIPPET...

Each SNIPPET (tools/intree/*.snippet, Kconfig.*, Makefile.*) starts with a
header of '# ' lines, up to the first empty line:

    # file: PATH          the kernel file it goes into (relative to the tree)
    # after: LINE         inserted after LINE, or
    # before: LINE        before it

LINE must occur exactly once in the pristine file (whitespace runs compare
equal).  The rest of the snippet is inserted as it is.  Several snippets may
edit one file.  STAGE/PATH is written only when its content changes, so that
an unchanged file keeps its modification time (the kernel build then has
nothing to redo for it); a file in STAGE that no snippet edits is removed.
Prints each edit, one a line.
"""
import os
import sys


def norm(line):
    return " ".join(line.split())


def parse(path):
    with open(path) as f:
        lines = f.read().split("\n")
    header = {}
    i = 0
    while i < len(lines) and lines[i].startswith("#"):
        key, sep, value = lines[i][2:].partition(": ")
        if sep and key in ("file", "after", "before"):
            header[key] = value
        i += 1
    if i >= len(lines) or lines[i] != "":
        sys.exit(f"place.py: {path}: the header must end with an empty line")
    body = lines[i + 1:]
    if body and body[-1] == "":
        body.pop()
    if "file" not in header or ("after" in header) == ("before" in header):
        sys.exit(f"place.py: {path}: needs 'file:' and one of 'after:', 'before:'")
    return header, body


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    pristine, stage, snippets = sys.argv[1], sys.argv[2], sys.argv[3:]
    edits = {}
    for snippet in snippets:
        header, body = parse(snippet)
        edits.setdefault(header["file"], []).append((snippet, header, body))
    for rel, items in sorted(edits.items()):
        with open(os.path.join(pristine, rel)) as f:
            lines = f.read().split("\n")
        for snippet, header, body in items:
            where = "after" if "after" in header else "before"
            anchor = norm(header[where])
            hits = [n for n, line in enumerate(lines) if norm(line) == anchor]
            if len(hits) != 1:
                sys.exit(f"place.py: {snippet}: '{header[where]}' occurs {len(hits)} "
                         f"times in {rel}, not once")
            at = hits[0] + (1 if where == "after" else 0)
            lines[at:at] = body
            print(f"{rel}: {len(body)} lines {where} '{header[where]}' "
                  f"({os.path.basename(snippet)})")
        text = "\n".join(lines)
        out = os.path.join(stage, rel)
        try:
            with open(out) as f:
                if f.read() == text:
                    continue
        except FileNotFoundError:
            pass
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out + ".tmp", "w") as f:
            f.write(text)
        os.replace(out + ".tmp", out)
    # A file no snippet edits any more goes.
    for root, _, files in os.walk(stage):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), stage)
            if rel not in edits:
                os.remove(os.path.join(root, name))


main()
