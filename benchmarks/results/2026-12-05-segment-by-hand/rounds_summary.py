"""rounds.txt -> per size: medians over rounds of the hand-written all-reduces' time / private memcpy,
and of dpkit's allreduce_perf time (host, registered) against the hand-written two-shot and direct of the same round."""
import re, statistics as st, sys
rounds, cur, mem = [], None, None
for line in open(sys.argv[1] if len(sys.argv) > 1 else "rounds.txt"):
    if line.startswith("# round"):
        cur = {"mimic": {}, "dpkit": {}}; rounds.append(cur); mem = None
    elif line.startswith("# allreduce_perf --memory"):
        mem = line.split()[-1]
    elif line.startswith("S "):
        p = line.split()
        cur["mimic"][(int(float(p[1]) * 2**20), p[3])] = (float(p[4]), float(p[8]))
    elif mem and line.strip() and line.split()[0].isdigit():
        p = line.split()
        cur["dpkit"][(int(p[0]), mem)] = (float(p[5]), float(p[9]))
sizes = sorted({k[0] for r in rounds for k in r["mimic"]})
med = lambda xs: st.median(xs)
print(f"{len(rounds)} rounds; medians (min-max) over rounds\n")
print("| size | one-shot / memcpy | two-shot / memcpy | direct / memcpy | direct, inputs rewritten / memcpy | dpkit host oop / hand two-shot | dpkit registered oop / hand direct |")
print("|---:|---|---|---|---|---|---|")
for s in sizes:
    cells = []
    for a in ("oneshot", "twoshot", "direct", "directw"):
        xs = sorted(r["mimic"][(s, a)][0] / r["mimic"][(s, a)][1] for r in rounds)
        cells.append(f"{med(xs):.2f} ({xs[0]:.2f}-{xs[-1]:.2f})")
    for m, a in (("host", "twoshot"), ("registered", "direct")):
        xs = sorted(r["dpkit"][(s, m)][0] / r["mimic"][(s, a)][0] for r in rounds if (s, m) in r["dpkit"])
        cells.append(f"{med(xs):.2f} ({xs[0]:.2f}-{xs[-1]:.2f})")
    print(f"| {s >> 20} MiB | " + " | ".join(cells) + " |")
