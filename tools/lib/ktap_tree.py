#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""Nested KTAP v1 for `make check` (tools/check.sh).

tools/check.sh prints the top level and the groups it runs live; this
script turns the logs of the groups that report only at their end into a
nested KTAP subtest each, as tools/testing/kunit/kunit.py parse reads it:

  ktap_tree.py cargo --number N --name NAME LOG
      the cargo test log: one result a test (`ignored` is a SKIP), one
      for a test binary that did not run to its summary
  ktap_tree.py vm --number N --name NAME [--dmesg FILE] [--kunit]
                  --status S --status-name TEXT LOG
      a VM run: with --kunit a subtest "kunit" holding our KUnit suites
      (rdma_cm_rs_*) as the guest's dmesg has them, then one subtest a part
      of the command's output (delimited by `ktap-part NAME` and
      `ktap-part-end NAME STATUS` lines, see tools/check.sh), then the
      run's own result (vm/run's exit status S, described by TEXT; when S
      is not 0, with the lines vm/run wrote of the run, from --diag FILE
      or LOG)

The manifest of a VM run (--expect-part NAME[=N], --expect-kunit
SUITE=N, each repeatable) says what it must report: a part that never
began is a failed subtest; a part or a suite with fewer results than
expected (N, or the plan line "1..N" a part printed) gets one failed leaf
for each result missing, so that a VM that died mid-run costs every
result it swallowed.

Every result is printed at --depth (default 1) and below; the subtest's own
result line ("ok N NAME") closes it one level up.  The counts of leaves go
to the file named by --counts as "passed failed skipped".  Names lose any
'#', which would start a KTAP directive.
"""

import argparse
import re
import sys

RESULT = re.compile(r'^(\s*)(ok|not ok) ([0-9]+)(?: -)? ?(.*?)(?:\s+#\s*(SKIP|TODO)\b\s*(.*))?$')
SUBTEST = re.compile(r'^(\s*)# Subtest: (\S+)')


def clean(name):
    name = name.replace('#', 'No.').strip()
    return name or 'unnamed'


class Node:
    """A subtest (children) or a leaf (status)."""

    def __init__(self, name, ok=True, skip=None, log=None):
        self.name = clean(name)
        self.children = None
        self.ok = ok
        self.skip = skip
        self.log = log or []

    @staticmethod
    def group(name, children, log=None):
        node = Node(name, log=log)
        node.children = children
        node.ok = all(c.ok for c in children) and len(children) > 0
        return node

    def emit(self, number, depth, out, counts):
        ind = '    ' * depth
        if self.children is not None:
            sub = '    ' * (depth + 1)
            out.append(f'{sub}KTAP version 1')
            out.append(f'{sub}# Subtest: {self.name}')
            out.append(f'{sub}1..{len(self.children)}')
            for line in self.log:
                out.append(f'{sub}# {line}')
            for i, child in enumerate(self.children, 1):
                child.emit(i, depth + 1, out, counts)
        else:
            for line in self.log:
                out.append(f'{ind}# {line}')
            if self.skip is not None:
                counts[2] += 1
            elif self.ok:
                counts[0] += 1
            else:
                counts[1] += 1
        status = 'ok' if self.ok else 'not ok'
        line = f'{ind}{status} {number} {self.name}'
        if self.skip is not None:
            line += f' # SKIP {self.skip}'
        out.append(line)


def result_leaf(match, log):
    """A leaf from a RESULT match; a SKIP counts as ok."""
    skip = match.group(6) if match.group(5) == 'SKIP' else None
    return Node(match.group(4), ok=match.group(2) == 'ok' or skip is not None,
                skip=skip, log=log)


def with_status(leaves, what, status):
    """A program's leaves and its exit status: the status is the only leaf
    of a program that printed none, and a failing one of its own when
    every leaf passed."""
    if not leaves:
        return [Node(f'{what}: exit status {status}', ok=status == 0)]
    if status != 0 and all(l.ok for l in leaves):
        return leaves + [Node(f'{what}: exit status {status}', ok=False)]
    return leaves


def flat_results(lines):
    """Leaves from flat (T)KTAP: the unindented results, with the
    diagnostics before each as its log."""
    leaves, log = [], []
    for line in lines:
        m = RESULT.match(line)
        if m and m.group(1) == '':
            leaves.append(result_leaf(m, log))
            log = []
        elif line.startswith('#'):
            log.append(line[1:].strip())
    return leaves


def cargo(args):
    lines = open(args.log, errors='replace').read().splitlines()
    leaves, binary, summaries, running = [], '', 0, 0
    for line in lines:
        m = re.match(r'^\s*Running (?:unittests )?(\S+)', line)
        if m:
            binary = m.group(1)
            running += 1
            continue
        m = re.match(r'^\s*Doc-tests (\S+)', line)
        if m:
            binary = f'doc-tests {m.group(1)}'
            running += 1
            continue
        m = re.match(r'^test (.+?) \.\.\. (ok|FAILED|ignored)', line)
        if m:
            outcome = m.group(2)
            leaves.append(Node(f'{binary}: {m.group(1)}', ok=outcome != 'FAILED',
                               skip='ignored' if outcome == 'ignored' else None))
        if line.startswith('test result: '):
            summaries += 1
    if running == 0 or summaries < running:
        leaves.append(Node('cargo test: every test binary ran to its summary', ok=False,
                           log=[f'{running} binaries started, {summaries} summaries',
                                f'see {args.log}']))
    else:
        leaves = with_status(leaves, 'cargo test', args.status)
    return Node.group(args.name, leaves)


def kunit_suites(dmesg):
    """Our suites (rdma_cm_rs_*) from a dmesg without timestamps, each a
    subtest whose cases are leaves.  KUnit indents a suite's header, plan
    and cases alike; the suite's result line is one level out."""
    lines = open(dmesg, errors='replace').read().splitlines()
    suites, i, seen = [], 0, {}
    while i < len(lines):
        m = SUBTEST.match(lines[i])
        if not m or not m.group(2).startswith('rdma_cm_rs_'):
            i += 1
            continue
        base, suite = len(m.group(1)), m.group(2)
        cases, log, closed = [], [], False
        i += 1
        while i < len(lines):
            line = lines[i]
            r = RESULT.match(line)
            if r and len(r.group(1)) < base and clean(r.group(4)) == suite:
                closed = True
                i += 1
                break
            header = SUBTEST.match(line)
            if r and len(r.group(1)) >= base:
                cases.append(result_leaf(r, log))
                log = []
            elif header and len(header.group(1)) < base:
                break  # another suite began: this one never ended
            elif not re.match(r'^\s*(KTAP version|1\.\.)', line):
                text = line.strip().lstrip('#').strip()
                if text and not text.startswith('module:'):
                    log.append(text)
            i += 1
        if not closed:
            cases.append(Node(f'{suite} ended', ok=False, log=['no result line for the suite']))
        seen[suite] = seen.get(suite, 0) + 1
        name = suite if seen[suite] == 1 else f'{suite} (run {seen[suite]})'
        suites.append(Node.group(name, cases))
    if not suites:
        suites.append(Node('a KUnit suite rdma_cm_rs_* ran', ok=False,
                           log=[f'none in {dmesg}']))
    return suites


def missing(what, got, want):
    """A failed leaf for each result of `what` from `got` + 1 to `want`."""
    return [Node(f'{what}: result {n} of {want} missing', ok=False,
                 log=['the manifest (tools/check.sh) expects it; the output has no such result'])
            for n in range(got + 1, want + 1)]


def expectations(pairs):
    """NAME[=N] pairs as {NAME: N or None}."""
    out = {}
    for pair in pairs or []:
        name, _, n = pair.partition('=')
        out[name] = int(n) if n else None
    return out


def plan_of(lines):
    """The N of a flat part's own plan line "1..N", if it printed one."""
    for line in lines:
        m = re.match(r'^1\.\.([0-9]+)$', line)
        if m:
            return int(m.group(1))
    return None


def with_manifest_kunit(suites, want):
    for node in suites:
        n = want.pop(node.name, None)
        if n is not None and len(node.children) < n:
            node.children += missing(node.name, len(node.children), n)
            node.ok = False
    for name, n in want.items():
        suites.append(Node.group(name, missing(name, 0, n or 1)))
    return suites


def vm(args):
    lines = open(args.log, errors='replace').read().splitlines()
    children = []
    want_parts = expectations(args.expect_part)
    want_kunit = expectations(args.expect_kunit)
    if args.kunit:
        if args.dmesg:
            suites = with_manifest_kunit(kunit_suites(args.dmesg), want_kunit)
            children.append(Node.group('kunit', suites))
        else:
            children.append(Node('kunit', ok=False, log=['no dmesg saved']))
    part, body = None, []
    for line in lines:
        m = re.match(r'^ktap-part (\S+)$', line)
        if m:
            part, body = m.group(1), []
            continue
        m = re.match(r'^ktap-part-end (\S+) (-?[0-9]+)$', line)
        if m and part == m.group(1):
            leaves = with_status(flat_results(body), part, int(m.group(2)))
            children.append(Node.group(part, part_in_full(part, body, leaves, want_parts)))
            part = None
            continue
        if part is not None:
            body.append(line)
    if part is not None:
        leaves = part_in_full(part, body, flat_results(body), want_parts)
        leaves.append(Node(f'{part}: ran to its end', ok=False,
                           log=['the output stops inside this part']))
        children.append(Node.group(part, leaves))
    for name, n in want_parts.items():
        children.append(Node.group(name, [Node(f'{name}: began', ok=False,
                                               log=['the output has no such part'])]
                                   + missing(name, 0, n or 0)))
    log = [f'tools/vm/run exit status {args.status}']
    if args.status != 0:
        log += vm_run_diagnostics(args.diag or args.log)
    children.append(Node(args.status_name, ok=args.status == 0, log=log))
    return Node.group(args.name, children)


def part_in_full(part, body, leaves, want_parts):
    """`leaves` and a failed one for each result the part's manifest entry
    (or its own plan) expects and it did not report; takes the part out of
    `want_parts`."""
    expected = want_parts.pop(part, None)
    if expected is None:
        expected = plan_of(body)
    results = sum(1 for l in leaves if not l.name.startswith(f'{part}: exit status'))
    if expected is not None and results < expected:
        leaves = leaves + missing(part, results, expected)
    return leaves


# What a failed VM run says of itself, at most this many of its last lines.
DIAGNOSTIC_LINES = 80


def vm_run_diagnostics(path):
    """The lines tools/vm/run wrote of a run (its `vm: ` lines: a VM
    killed and why, the harness' errors, the last console lines of a VM
    that did not finish, the dmesg gate's findings), so that the reason
    of a failed run is in what make check prints, not only in its logs:
    CI keeps only the former."""
    try:
        lines = open(path, errors='replace').read().splitlines()
    except OSError as e:
        return [f'no log of the run: {e}']
    said = [line for line in lines if line.startswith('vm: ')]
    if len(said) > DIAGNOSTIC_LINES:
        left = len(said) - DIAGNOSTIC_LINES
        said = [f'({left} earlier lines in {path})'] + said[-DIAGNOSTIC_LINES:]
    return said


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('kind', choices=['cargo', 'vm'])
    p.add_argument('log')
    p.add_argument('--number', type=int, required=True)
    p.add_argument('--name', required=True)
    p.add_argument('--depth', type=int, default=0)
    p.add_argument('--counts', required=True)
    p.add_argument('--status', type=int, default=0)
    p.add_argument('--status-name', default='the VM run')
    p.add_argument('--dmesg')
    p.add_argument('--kunit', action='store_true')
    p.add_argument('--expect-part', action='append', metavar='NAME[=N]',
                   help='a part the VM run must report, with N results if given')
    p.add_argument('--expect-kunit', action='append', metavar='SUITE=N',
                   help='a KUnit suite the VM run must report, with N cases')
    p.add_argument('--diag', help='the log holding tools/vm/run\'s own lines '
                   '(default LOG), printed when --status is not 0')
    args = p.parse_args()
    node = cargo(args) if args.kind == 'cargo' else vm(args)
    out, counts = [], [0, 0, 0]
    node.emit(args.number, args.depth, out, counts)
    print('\n'.join(out))
    with open(args.counts, 'w') as f:
        f.write(f'{counts[0]} {counts[1]} {counts[2]}\n')
    return 0 if node.ok else 1


if __name__ == '__main__':
    sys.exit(main())
