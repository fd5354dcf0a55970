#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Counts the distinct checks behind a KTAP tree's results.

tools/lib/distinct_checks.py FILE

A scenario of the suite runs once per transport and mode (rxe, siw; async,
synchronous) and in one VM and in two: its results differ only by the
prefix of their names ("rxe_", "siw_sync_mode_", "VM A: ").  This prints
"RESULTS DISTINCT SKIPPED": the leaf results of FILE (a result line with
no subtest above it), how many different checks they are once those
prefixes are set aside, and how many of the leaves were skipped.
"""
import re
import sys

RESULT = re.compile(r'^(\s*)(?:not )?ok [0-9]+ (?:- )?(.*?)(\s+#\s*SKIP\b.*)?$')
PREFIX = re.compile(r'^(?:VM [AB]: )?(?:(?:rxe|siw)_(?:sync_mode_)?)?')


def main(path):
    lines = [l.rstrip('\n') for l in open(path, encoding='utf-8', errors='replace')]
    leaves, distinct, skipped = 0, set(), 0
    prev_indent = None  # indentation of the last result or plan line
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if re.match(r'^\s*1\.\.[0-9]+', line):
            prev_indent = indent
            continue
        m = RESULT.match(line)
        if not m:
            continue
        # A result whose last result/plan line above is deeper closes a
        # subtest: it is a group's, not a check's.
        if prev_indent is not None and prev_indent > indent:
            prev_indent = indent
            continue
        prev_indent = indent
        leaves += 1
        if m.group(3):
            skipped += 1
        distinct.add(PREFIX.sub('', m.group(2)))
    print(leaves, len(distinct), skipped)


if __name__ == '__main__':
    main(sys.argv[1])
