# Per-round B/A and C/A ratios of paired-bk-9rounds.txt (README.md here).
import re,collections,statistics,sys
d=collections.defaultdict(dict); R=set()
for line in open(sys.argv[1]):
    if line.startswith('=='):
        m=re.match(r'== r(\d+) t(\d+) c(\w)',line); cur=(int(m.group(1)),int(m.group(2)),m.group(3)); R.add(cur[0])
    elif line[0].isdigit():
        f=line.split(); d[(cur[1],f[1])][(cur[0],cur[2])]=float(f[3])
print("A: landed tiles (bf16 mode: 128x64 not causal, 64x64 causal); B: BK=128; C: 64x128. Step ms medians; paired ratio medians")
for key in sorted(d):
    v=d[key]
    def med(c): return statistics.median([v[(r,c)] for r in R if (r,c) in v])
    def pr(c): 
        x=[v[(r,c)]/v[(r,'A')] for r in sorted(R) if (r,c) in v and (r,'A') in v]; return f"{statistics.median(x):.3f} [{min(x):.2f}-{max(x):.2f}]"
    print(f"t{key[0]:2d} {key[1]:24s} A {med('A'):7.2f}  B {med('B'):7.2f} B/A {pr('B')}  C {med('C'):7.2f} C/A {pr('C')}")
