# Per-round B/A, C/A ratios of paired-bk-exact-split-7rounds.txt (README.md here).
import re,collections,statistics,sys
d=collections.defaultdict(dict); R=set()
for line in open(sys.argv[1]):
    if line.startswith('=='):
        m=re.match(r'== r(\d+) t(\d+) (\w+) c(\w)',line); cur=(int(m.group(1)),int(m.group(2)),m.group(3),m.group(4)); R.add(cur[0])
    elif line[0].isdigit():
        f=line.split(); d[(cur[2],cur[1],f[1])][(cur[0],cur[3])]=float(f[3])
print("A: 64x64 (exact, split today); B: 64x128; C: 128x128. Step ms medians; medians of paired per-round ratios")
for key in sorted(d):
    v=d[key]
    def med(c): return statistics.median([v[(r,c)] for r in R if (r,c) in v])
    def pr(c):
        x=[v[(r,c)]/v[(r,'A')] for r in sorted(R) if (r,c) in v and (r,'A') in v]; return f"{statistics.median(x):.3f} [{min(x):.2f}-{max(x):.2f}]"
    print(f"{key[0]:5s} t{key[1]:2d} {key[2]:24s} A {med('A'):7.2f}  B {med('B'):7.2f} B/A {pr('B')}  C {med('C'):7.2f} C/A {pr('C')}")
