# Per round: entries of allreduce_perf -A all within 10% (store launch / mpirun), the shm all-reduce at 8 B on both
# (the VM phase: ~0.22 us fast, ~0.6 slow), and what is out. Usage: cd DIR/one-node; python3 ../per_round.py
import re
def parse(f):
    d = {}; alg = None
    for line in open(f):
        m = re.match(r'# Algorithm: (\S+)', line)
        if m: alg = m.group(1); continue
        if line.startswith('#') or not line.strip(): continue
        t = line.split()
        if len(t) < 13: continue
        d[(alg, int(t[0]), 'oop')] = float(t[5]); d[(alg, int(t[0]), 'ip')] = float(t[9])
    return d
for r in range(1, 40):
    try: S = parse(f'store{r}.txt'); M = parse(f'mpi{r}.txt')
    except FileNotFoundError: continue
    ks = [k for k in M if k in S]
    out = [(k, S[k]/M[k]) for k in ks if S[k]/M[k] > 1.10]
    print(f"r{r}: {len(ks)-len(out)}/{len(ks)} within 10%; shm 8B store {S[('shm',8,'oop')]} mpi {M[('shm',8,'oop')]}; tree 2K {S[('tree',2048,'oop')]}/{M[('tree',2048,'oop')]}; out: " + ' '.join(f"{a}{s}{p}:{x:.2f}" for (a,s,p),x in out))
