import sys,re
p=sys.argv[1]; s=open(p).read()
i=s.index("    // This PE's own words are loaded first"); j=s.index("    for (int pe = 0; pe < t.n; pe++) {\n        Words got[kU];")
s=s[:i]+s[j:]
old="            for (int u = 0; u < kU; u++) a[u] = own_a[u], b[u] = own_b[u];"
assert s.count(old)==1
s=s.replace(old,"            for (int u = 0; u < kU; u++) ll.load(own, bytes, line[u], live[u], a[u], b[u]);")
open(p,'w').write(s)
