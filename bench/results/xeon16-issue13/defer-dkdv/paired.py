# Per-round chunked/unchunked ratios of paired-chunk.txt (README.md here).
import re,collections,statistics,sys
d=collections.defaultdict(dict); R=set()
cur=None
for line in open(sys.argv[1]):
    if line.startswith('=='):
        m=re.match(r'== r(\d+) t(\d+) (\w+) c(\d)',line); cur=(int(m.group(1)),int(m.group(2)),m.group(3),int(m.group(4))); R.add(cur[0])
    elif line[0].isdigit():
        f=line.split(); d[(cur[1],cur[2],f[1])][(cur[0],cur[3])]=float(f[3])
print("chunked (default) / one q-tile per dK,dV product (the previous code): step time")
for key in sorted(d):
    v=d[key]
    ratios=[v[(r,0)]/v[(r,1)] for r in sorted(R) if (r,0) in v and (r,1) in v]
    print(f"t{key[0]:2d} {key[1]:5s} {key[2]:24s} old {statistics.median([v[(r,1)] for r in R]):7.2f}  new {statistics.median([v[(r,0)] for r in R]):7.2f}  paired new/old median {statistics.median(ratios):.3f} [{min(ratios):.2f}-{max(ratios):.2f}] n={len(ratios)}")
