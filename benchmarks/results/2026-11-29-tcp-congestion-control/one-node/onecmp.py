import sys
def parse(f):
    t={}; algo=None
    for l in open(f):
        if l.startswith('# Algorithm:'): algo=l.split(':')[1].strip(); continue
        x=l.split()
        if l.startswith('#') or len(x)<13 or not x[0].isdigit() or algo is None: continue
        t[(algo,int(x[0]))]=(float(x[5]),float(x[9]),x[8],x[12])
    return t
a=parse(sys.argv[1]); b=parse(sys.argv[2]); ok=n=0; out=[]; wrong=0
for k in sorted(a, key=lambda k:(k[0],k[1])):
    if k not in b: continue
    r1=a[k][0]/b[k][0]; r2=a[k][1]/b[k][1]; ok+=(r1<=1.1)+(r2<=1.1); n+=2
    wrong+=sum(v!='0' for v in (a[k][2],a[k][3],b[k][2],b[k][3]))
    out.append(f"| {k[0]} | {k[1]} | {r1:.2f} | {r2:.2f} |")
print("| algorithm | bytes | store/mpirun out | in |"); print("\n".join(out))
print(f"within 10%: {ok} of {n}; #wrong entries {wrong}")
