# dist_allreduce_perf tables: per-size store-launch/mpirun ratios (median of rounds, rounds in brackets).
# Usage: python3 python_compare.py DIR torchrun mpirun   (or deb_env deb_mpirun)
import sys, glob, statistics
d, a, b = sys.argv[1:4]
def parse(f):
    t = {}
    for line in open(f):
        if line.startswith('#') or not line.strip(): continue
        x = line.split(); t[int(x[0])] = (float(x[2]), float(x[6]), x[5], x[9])
    return t
A = [parse(f) for f in sorted(glob.glob(f'{d}/{a}[0-9]*.txt'))]; B = [parse(f) for f in sorted(glob.glob(f'{d}/{b}[0-9]*.txt'))]
n = min(len(A), len(B)); ok = 0; okr = [0]*n; mg = 1e9
print('| bytes | dpkit store launch (us) | dpkit mpirun (us) | store/mpirun (rounds) | gloo/dpkit (store) |')
for s in sorted(A[0]):
    rs = [A[i][s][0] / B[i][s][0] for i in range(n)]
    m = statistics.median(rs); ok += m <= 1.10
    for i in range(n): okr[i] += rs[i] <= 1.10
    g = min(A[i][s][1] / A[i][s][0] for i in range(n)); mg = min(mg, g)
    assert all(A[i][s][2] == '0' and B[i][s][2] == '0' for i in range(n))
    print(f"| {s} | {statistics.median(A[i][s][0] for i in range(n)):.1f} | {statistics.median(B[i][s][0] for i in range(n)):.1f} | {'**' if m > 1.10 else ''}{m:.2f}{'**' if m > 1.10 else ''} ({' '.join(f'{r:.2f}' for r in rs)}) | {g:.1f} |")
print(f"within 10% (median of rounds): {ok} of {len(A[0])}; per round: {okr}; min gloo/dpkit {mg:.2f}; #wrong 0")
