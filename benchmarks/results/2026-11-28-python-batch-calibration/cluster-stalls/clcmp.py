import sys
def parse(f):
    t={}
    for l in open(f):
        x=l.split()
        if l.startswith('#') or len(x)<13 or not x[0].isdigit(): continue
        t[int(x[0])]=(float(x[5]),float(x[9]),x[8],x[12])
    return t
a=parse(sys.argv[1]); b=parse(sys.argv[2]); ok=0; n=0
print("| bytes | launch out (us) | mpirun out (us) | ratio | launch in (us) | mpirun in (us) | ratio |")
for s in sorted(a):
    if s not in b: continue
    r1=a[s][0]/b[s][0]; r2=a[s][1]/b[s][1]; ok+=(r1<=1.1)+(r2<=1.1); n+=2
    assert a[s][2]==a[s][3]==b[s][2]==b[s][3]=='0'
    print(f"| {s} | {a[s][0]} | {b[s][0]} | {r1:.2f} | {a[s][1]} | {b[s][1]} | {r2:.2f} |")
print(f"within 10%: {ok} of {n}; #wrong 0")
