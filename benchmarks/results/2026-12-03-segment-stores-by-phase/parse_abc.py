import sys, re, statistics as st, collections
# lines: time v=X probes p1 p2 | 16M a/b 64M a/b 256M a/b
rows=[]
for f in sys.argv[1:]:
    for l in open(f):
        m=re.match(r'(\S+) v=(\S+) probes (\d+) (\d+) \| (.*)', l.strip())
        if not m: continue
        t,v,p1,p2,rest=m.groups()
        vals=rest.split()
        d={}
        for i in range(0,len(vals),2):
            o,ip=vals[i+1].split('/'); d[vals[i]]=(float(o),float(ip))
        rows.append((t,v,int(p1),int(p2),d))
def phase(p1,p2):
    if p1<300 and p2<300: return 'fast'
    if p1>=450 and p2>=450: return 'slow'
    return 'mixed'
for size in ['16M','64M','256M']:
    print(f"## {size} (ms, median out of place / in place; n runs)")
    print("| phase (probes) | ordinary (0) | tuned (auto) | non-temporal (1) |")
    print("|---|---|---|---|")
    for ph in ['fast','slow','mixed']:
        cells=[]
        for v in ['0','auto','1']:
            xs=[r[4][size] for r in rows if r[1]==v and phase(r[2],r[3])==ph and size in r[4]]
            if xs: cells.append(f"{st.median(x[0] for x in xs)/1000:.1f} / {st.median(x[1] for x in xs)/1000:.1f} ({len(xs)})")
            else: cells.append("-")
        print(f"| {ph} | "+" | ".join(cells)+" |")
