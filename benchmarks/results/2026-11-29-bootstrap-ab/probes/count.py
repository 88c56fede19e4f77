# count.py FILE...: per dist_allreduce_perf table, how many rows have the last column (ratio) within
# 10% (<= 1.10, as the check) and within +-10% both ways; the extremes.
import sys
for f in sys.argv[1:]:
    r = [float(l.split()[-1]) for l in open(f) if l.strip() and not l.startswith('#')]
    print(f"{f}: {sum(x <= 1.10 for x in r)} of {len(r)} <= 1.10; {sum(1/1.10 <= x <= 1.10 for x in r)} within +-10%; "
          f"min {min(r):.2f} max {max(r):.2f}")
