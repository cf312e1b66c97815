# Per-round 128/64 ratios of a paired bq run (see README.md here).
import re,collections,statistics,sys
d=collections.defaultdict(dict)
cur=None;n=0;R=set()
for line in open(sys.argv[1]):
    if line.startswith('=='):
        m=re.match(r'== r(\d+) t(\d+) bq(\d+)',line); cur=(int(m.group(1)),int(m.group(2)),int(m.group(3))); n=0; R.add(cur[0])
    elif line[0].isdigit():
        f=line.split(); kind='bwd' if n<4 else 'fwd'; d[(cur[1],kind,f[1])][(cur[0],cur[2])]=float(f[3]); n+=1
for key in sorted(d):
    t,kind,s=key; v=d[key]
    ratios=[v[(r,128)]/v[(r,64)] for r in sorted(R) if (r,128) in v and (r,64) in v]
    print(f"t{t:2d} {kind} {s:24s} 64: {statistics.median([v[(r,64)] for r in R]):7.2f}  128: {statistics.median([v[(r,128)] for r in R]):7.2f}  paired 128/64 median {statistics.median(ratios):.3f}  [{min(ratios):.2f}-{max(ratios):.2f}] n={len(ratios)}")
