# per-pair count of sizes within 10%: A/B pairs and A/A pairs in a deb.sh dir
import sys, glob
def parse(f):
    t = {}
    for line in open(f):
        if line.startswith('#') or not line.strip(): continue
        x = line.split(); t[int(x[0])] = float(x[2])
    return t
d = sys.argv[1]
E = [parse(f) for f in sorted(glob.glob(f'{d}/env[0-9]*.txt'))]; M = [parse(f) for f in sorted(glob.glob(f'{d}/mpirun[0-9]*.txt'))]
def cnt(a, b): return sum(a[s] / b[s] <= 1.10 for s in a)
def both(a, b): return sum(0.909 <= a[s] / b[s] <= 1.10 for s in a)
n = min(len(E), len(M))
print('env_i/mpirun_i <=1.1:', [cnt(E[i], M[i]) for i in range(n)])
print('mpirun_{i+1}/mpirun_i <=1.1:', [cnt(M[i+1], M[i]) for i in range(n-1)], ' mpirun_i/mpirun_{i+1}:', [cnt(M[i], M[i+1]) for i in range(n-1)])
print('env_{i+1}/env_i <=1.1:', [cnt(E[i+1], E[i]) for i in range(n-1)])
print('mpirun A/A within +-10% both ways:', [both(M[i+1], M[i]) for i in range(n-1)])
