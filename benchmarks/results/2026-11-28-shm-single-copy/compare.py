# Per-entry store/mpirun ratios of dpkit *_perf tables (benchmarks/results/2026-11-28-shm-single-copy.md):
# DIR holds mpiN.txt and storeN.txt of alternating rounds; each cell is the median over rounds, * above 1.10.
import sys, glob, statistics, re
def parse(f):
    d = {}; alg = None
    for line in open(f):
        m = re.match(r'# Algorithm: (\S+)', line)
        if m: alg = m.group(1); continue
        if line.startswith('#') or not line.strip(): continue
        t = line.split()
        if len(t) < 13: continue
        size = int(t[0]); d[(alg, size, 'oop')] = float(t[5]); d[(alg, size, 'ip')] = float(t[9])
        assert t[8] == '0' and t[12] == '0', (f, line)
    return d
# usage: compare.py DIR [--rounds]  (files mpiN.txt storeN.txt; --rounds: also each round's count, the shm
# all-reduce at 8 B on both launches (the VM's phase: ~0.22 us fast, ~0.6 slow) and the entries out)
dr = sys.argv[1]
mp = sorted(glob.glob(dr + '/mpi*.txt')); stf = sorted(glob.glob(dr + '/store*.txt'))
M = [parse(f) for f in mp]; S = [parse(f) for f in stf]
n = min(len(M), len(S))
keys = [k for k in M[0].keys() if k in S[0]]
algs = []
for k in keys:
    if k[0] not in algs: algs.append(k[0])
sizes = sorted({k[1] for k in keys})
out = 0; tot = 0
print('size ' + ' '.join(f'{a:>13}' for a in algs))
for s in sizes:
    row = []
    for a in algs:
        cell = []
        for p in ('oop', 'ip'):
            r = statistics.median(S[i][(a, s, p)] / M[i][(a, s, p)] for i in range(n))
            tot += 1; out += r > 1.10
            cell.append(('*' if r > 1.10 else '') + f'{r:.2f}')
        row.append('/'.join(cell))
    print(f'{s:>10} ' + ' '.join(f'{c:>13}' for c in row))
print(f'within 10%: {tot-out}/{tot} over {n} rounds')
if '--rounds' in sys.argv:
    for i in range(n):
        out_i = [(k, S[i][k] / M[i][k]) for k in keys if S[i][k] / M[i][k] > 1.10]
        print(f"round {i + 1}: {len(keys) - len(out_i)}/{len(keys)} within 10%; shm 8 B store {S[i][('shm', 8, 'oop')]} "
              f"mpirun {M[i][('shm', 8, 'oop')]} us; out: " + ' '.join(f'{a} {s} {p} {x:.2f}' for (a, s, p), x in out_i))
