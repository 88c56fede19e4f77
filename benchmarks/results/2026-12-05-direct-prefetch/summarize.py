"""Summarize the old/new allreduce_perf runs in ab_1m_16m/ (files VARIANT.MEMORY.ROUND.txt):
median time over rounds per size and placement, and the median of each run's time / floor."""
import glob, re, statistics as st, sys, os

d = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "ab_1m_16m")
times, ratio = {}, {}
for f in glob.glob(d + "/*.txt"):
    v, m, _r, _ = os.path.basename(f).split(".")
    for line in open(f):
        p = line.split()
        if not line.startswith("#") and len(p) >= 13 and p[0].isdigit():
            times.setdefault((m, int(p[0]), v), []).append((float(p[5]), float(p[9])))
        if "time/floor" in line:
            o = float(re.search(r"oop ([\d.]+)", line).group(1))
            i = float(re.search(r"ip ([\d.]+)", line).group(1))
            ratio.setdefault((m, int(p[2]), v), []).append((o, i))
print("| memory | size | oop old (us) | oop new (us) | ip old | ip new | oop/floor old | oop/floor new | ip/floor old | ip/floor new |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for m in sorted({k[0] for k in times}):
    for size in sorted({k[1] for k in times if k[0] == m}):
        c = []
        for col in (0, 1):
            for v in ("old", "new"):
                c.append(f"{st.median(x[col] for x in times[(m, size, v)]):.1f}")
        for col in (0, 1):
            for v in ("old", "new"):
                c.append(f"{st.median(x[col] for x in ratio[(m, size, v)]):.2f}")
        print(f"| {m} | {size >> 20} MiB | " + " | ".join(c) + " |")
