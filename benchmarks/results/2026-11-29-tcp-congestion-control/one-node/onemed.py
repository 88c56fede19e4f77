import sys, statistics, glob
def parse(f):
    t={}; algo=None
    for l in open(f):
        if l.startswith('# Algorithm:'): algo=l.split(':')[1].strip(); continue
        x=l.split()
        if l.startswith('#') or len(x)<13 or not x[0].isdigit() or algo is None: continue
        t[(algo,int(x[0]))]=(float(x[5]),float(x[9]),x[8],x[12])
    return t
d=sys.argv[1]; n=int(sys.argv[2])  # DIR with store1..N.txt and mpirun1..N.txt
S=[parse(f"{d}/store{i}.txt") for i in range(1,n+1)]; M=[parse(f"{d}/mpirun{i}.txt") for i in range(1,n+1)]
ok=tot=0; rows=[]
for k in sorted(S[0]):
    r=[]
    for j in (0,1):
        r.append(statistics.median([s[k][j] for s in S])/statistics.median([m[k][j] for m in M]))
    ok+=sum(x<=1.1 for x in r); tot+=2
    rows.append((k,r))
print("| algorithm | bytes | out | in |")
for k,r in rows: print(f"| {k[0]} | {k[1]} | {r[0]:.2f} | {r[1]:.2f} |")
print(f"median of rounds: within 10% {ok} of {tot}")
