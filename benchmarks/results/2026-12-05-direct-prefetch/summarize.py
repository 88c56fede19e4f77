"""Summarize allreduce_perf runs saved as VARIANT.MEMORY.ROUND.txt in one folder (default ab_1m_16m/):
per memory, size and variant, the median over rounds of the out-of-place and in-place times (us) and of
each run's own time / floor (its --floor line), as a Markdown table.

    python3 summarize.py [FOLDER]
"""
import glob, os, re, statistics as st, sys

d = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "ab_1m_16m")
times, ratio, variants = {}, {}, []
for f in sorted(glob.glob(os.path.join(d, "*.txt"))):
    v, m, _r, _ = os.path.basename(f).split(".")
    if v not in variants:
        variants.append(v)
    for line in open(f):
        p = line.split()
        if not line.startswith("#") and len(p) >= 13 and p[0].isdigit():
            times.setdefault((m, int(p[0]), v), []).append((float(p[5]), float(p[9])))
        if "time/floor" in line:
            o = float(re.search(r"oop ([\d.]+)", line).group(1))
            i = float(re.search(r"ip ([\d.]+)", line).group(1))
            ratio.setdefault((m, int(p[2]), v), []).append((o, i))
order = {"old": 0, "new": 1}
variants.sort(key=lambda v: (order.get(v, 2), len(v), v))
print("| memory | size | " + " | ".join(f"{v}: oop us, ip us, oop/floor, ip/floor" for v in variants) + " |")
print("|---|---:|" + "---|" * len(variants))
for m in sorted({k[0] for k in times}):
    for size in sorted({k[1] for k in times if k[0] == m}):
        cells = []
        for v in variants:
            t, r = times.get((m, size, v)), ratio.get((m, size, v))
            if not t:
                cells.append("")
                continue
            c = f"{st.median(x[0] for x in t):.1f}, {st.median(x[1] for x in t):.1f}"
            if r:
                c += f", {st.median(x[0] for x in r):.2f}, {st.median(x[1] for x in r):.2f}"
            cells.append(c)
        print(f"| {m} | {size >> 20} MiB | " + " | ".join(cells) + " |")
