# allreduce_perf -A all tables, store launch against mpirun:
#   compare.py STORE.txt MPIRUN.txt   one round: each entry's ratio, and how many are within 10%
#   compare.py --median DIR N         DIR/store1..N.txt against DIR/mpirun1..N.txt: median of the rounds
import statistics, sys
def parse(f):
    t = {}; algo = None
    for l in open(f):
        if l.startswith('# Algorithm:'): algo = l.split(':')[1].strip(); continue
        x = l.split()
        if l.startswith('#') or len(x) < 13 or not x[0].isdigit() or algo is None: continue
        t[(algo, int(x[0]))] = (float(x[5]), float(x[9]), x[8], x[12])
    return t
if sys.argv[1] == '--median':
    d, n = sys.argv[2], int(sys.argv[3])
    S = [parse(f"{d}/store{i}.txt") for i in range(1, n + 1)]; M = [parse(f"{d}/mpirun{i}.txt") for i in range(1, n + 1)]
    what = "median of rounds"
else:
    S = [parse(sys.argv[1])]; M = [parse(sys.argv[2])]
    what = "one round"
ok = tot = wrong = 0
print("| algorithm | bytes | store/mpirun out | in |")
for k in sorted(S[0]):
    if any(k not in m for m in M): continue
    r = [statistics.median([s[k][j] for s in S]) / statistics.median([m[k][j] for m in M]) for j in (0, 1)]
    wrong += sum(v != '0' for t in S + M for v in (t[k][2], t[k][3]))
    ok += sum(x <= 1.1 for x in r); tot += 2
    print(f"| {k[0]} | {k[1]} | {r[0]:.2f} | {r[1]:.2f} |")
print(f"{what}: within 10% {ok} of {tot}; #wrong entries {wrong}")
