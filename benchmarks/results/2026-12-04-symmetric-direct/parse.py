#!/usr/bin/env python3
"""Medians over rounds of allreduce_perf --floor runs: per size, time / floor out of and in place.
usage: parse.py LABEL=glob [LABEL=glob ...], e.g. parse.py "host=OUT/r*_host.txt" "sym=OUT/r*_sym.txt"
"""
import glob, re, statistics, sys
rx = re.compile(r"#\s+floor\s+(\d+) B:\s+([\d.]+) us.*time/floor: oop ([\d.]+), ip ([\d.]+)")
row = re.compile(r"^\s+(\d+)\s+\d+\s+\w+\s+\w+\s+-?\d+\s+([\d.]+)\s+\S+\s+\S+\s+\d+\s+([\d.]+)")
res = {}
for arg in sys.argv[1:]:
    label, pat = arg.split("=", 1)
    for f in sorted(glob.glob(pat)):
        for line in open(f):
            m = rx.search(line)
            if m:
                size = int(m.group(1))
                res.setdefault(size, {}).setdefault(label, []).append((float(m.group(3)), float(m.group(4)), float(m.group(2))))
labels = [a.split("=", 1)[0] for a in sys.argv[1:]]
print("| size | " + " | ".join(f"{l} oop / floor | {l} ip / floor" for l in labels) + " |")
print("|---:|" + "---|---|" * len(labels))
def mib(s):
    return f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB"
for size in sorted(res):
    cells = []
    for l in labels:
        v = res[size].get(l, [])
        if not v:
            cells += ["", ""]; continue
        o = [x[0] for x in v]; i = [x[1] for x in v]
        cells.append(f"**{statistics.median(o):.2f}** ({' '.join(f'{x:.2f}' for x in o)})")
        cells.append(f"**{statistics.median(i):.2f}** ({' '.join(f'{x:.2f}' for x in i)})")
    print(f"| {mib(size)} | " + " | ".join(cells) + " |")
