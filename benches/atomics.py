#!/usr/bin/env python3
"""Atomic read-modify-writes per request, from two callgrind profiles taken
with --dump-instr=yes (benches/callgrind.sh with ATOMICS=1).

An atomic read-modify-write on x86 is a lock-prefixed instruction or an
xchg with memory (xchg between registers, `xchg %ax,%ax` included, is not
one: the latter is a two-byte no-op). Each costs ~20 cycles uncontended,
more when another core wrote its line last, and callgrind counts it as one
instruction: its instruction counts do not show them. This counts them by
address: every such instruction in the objects' code (objdump), executed
how often in each profile, the difference per request, by function.

    atomics.py PROFILE-N1 PROFILE-N2 REQUESTS OBJECT...
"""
import collections
import re
import subprocess
import sys

ATOMIC = re.compile(r"^\s*([0-9a-f]+):\s+(lock\b|xchg\s+[^,]*\(|xchg\s+%\w+,[^%])")


def atomic_addresses(obj):
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", obj],
                         capture_output=True, text=True, check=True).stdout
    return {int(m.group(1), 16) for m in map(ATOMIC.match, out.splitlines()) if m}


def executed(profile, atomics):
    """Executions of the atomic instructions, by function. Addresses in a
    --dump-instr profile are relative to their object, as objdump's are."""
    by_fn = collections.Counter()
    names = {}
    ob = fn = None
    addr = 0
    after_call = False
    with open(profile) as f:
        for line in f:
            m = re.match(r"(c?ob|c?fn|c?fl|fi|fe)=\((\d+)\)(?: (.*))?", line)
            if m:
                kind, idx, name = m.groups()
                base = kind.lstrip("c")
                if name:
                    names[(base, idx)] = name.strip()
                if kind == "ob":
                    ob = names.get(("ob", idx))
                elif kind == "fn":
                    fn = names.get(("fn", idx))
                continue
            if line.startswith("calls="):
                after_call = True  # the next line is the call's inclusive cost
                continue
            parts = line.split()
            if not parts or not re.match(r"0x|[+-]|\*$", parts[0]):
                continue
            p = parts[0]
            if p.startswith("0x"):
                addr = int(p, 16)
            elif p[0] in "+-":
                delta = int(p[1:], 16) if p[1:].startswith("0x") else int(p[1:])
                addr += delta if p[0] == "+" else -delta
            if after_call:
                after_call = False
                continue
            if len(parts) >= 3 and addr in atomics.get(ob, ()):
                by_fn[fn] += int(parts[2])
    return by_fn


def main():
    first, second, requests, objects = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
    atomics = {obj: atomic_addresses(obj) for obj in objects}
    a, b = executed(first, atomics), executed(second, atomics)
    rows = sorted(((b[k] - a[k]) / requests, k) for k in set(a) | set(b))
    rows.reverse()
    print(f"atomic read-modify-writes per request: {sum(v for v, _ in rows):.1f}")
    for v, k in rows[:20]:
        if v >= 0.5:
            print(f"  {v:5.1f}  {k[:110]}")


if __name__ == "__main__":
    main()
