import re,sys,glob,statistics as st,os
d=sys.argv[1]; vs=sys.argv[2].split(',')
res={}
for f in sorted(glob.glob(d+'/*.txt')):
    v,r=os.path.basename(f)[:-4].rsplit('_',1)
    rows={}
    for l in open(f):
        m=re.match(r'\s+(\d+)\s+\d+\s+\w+\s+\w+\s+-?\d+\s+([\d.]+)\s+\S+\s+\S+\s+\d+\s+([\d.]+)',l)
        if m: size=int(m[1]); rows[size]=[float(m[2]),float(m[3])]
        m=re.match(r'#\s+floor\s+(\d+) B:\s+([\d.]+) us',l)
        if m: rows[int(m[1])].append(float(m[2]))
    res.setdefault(v,{})[r]=rows
sizes=sorted(next(iter(next(iter(res.values())).values())).keys())
print("size | "+" | ".join(f"{v} oop/floor, ip/floor (median; rounds)" for v in vs))
for s in sizes:
    cells=[]
    for v in vs:
        o=[res[v][r][s][0]/res[v][r][s][2] for r in sorted(res[v])]
        i=[res[v][r][s][1]/res[v][r][s][2] for r in sorted(res[v])]
        cells.append(f"{st.median(o):.2f}/{st.median(i):.2f} ({' '.join(f'{x:.2f}' for x in o)} | {' '.join(f'{x:.2f}' for x in i)})")
    print(f"{s>>20} MiB | "+" | ".join(cells))
print("times us median oop/ip")
for s in sizes:
    print(f"{s>>20} MiB | "+" | ".join(f"{v}: {st.median(res[v][r][s][0] for r in res[v]):.0f}/{st.median(res[v][r][s][1] for r in res[v]):.0f} floor {st.median(res[v][r][s][2] for r in res[v]):.0f}" for v in vs))
