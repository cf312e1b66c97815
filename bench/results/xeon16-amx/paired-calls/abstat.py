import sys,collections,statistics as st
d=collections.defaultdict(dict)
for l in open(sys.argv[1]):
  r,th,p,c,s,a,f=l.split(); d[(s,p,int(th))].setdefault(r,{})[c]=(float(a),float(f))
print('shape mode threads (rounds): cfg/base, medians of per-round ratios [min-over-rounds ratio]: step | forward')
for k in sorted(d):
  for c in sorted({c for r in d[k] for c in d[k][r]} - {'base'}):
    rr=[r for r in d[k] if c in d[k][r] and 'base' in d[k][r]]
    if not rr: continue
    out=[]
    for i in (0,1):
      rs=[d[k][r][c][i]/d[k][r]['base'][i] for r in rr]
      out.append('%.3f [%.3f]'%(st.median(rs),min(d[k][r][c][i] for r in rr)/min(d[k][r]['base'][i] for r in rr)))
    print(*k,c,'(%d)'%len(rr),' | '.join(out))
