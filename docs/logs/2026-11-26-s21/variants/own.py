import sys
p=sys.argv[1]; s=open(p).read()
old="""    for (int pe = 0; pe < t.n; pe++) {
        Words got[kU];
        uint64_t a[kU], b[kU];
        if (pe == t.rank) {
#pragma unroll
            for (int u = 0; u < kU; u++) ll.load(own, bytes, line[u], live[u], a[u], b[u]);
        } else {
"""
new="""    uint64_t own_a[kU], own_b[kU];
#pragma unroll
    for (int u = 0; u < kU; u++) ll.load(own, bytes, line[u], live[u], own_a[u], own_b[u]);
    for (int pe = 0; pe < t.n; pe++) {
        Words got[kU];
        uint64_t a[kU], b[kU];
        if (pe == t.rank) {
#pragma unroll
            for (int u = 0; u < kU; u++) a[u] = own_a[u], b[u] = own_b[u];
        } else {
"""
assert s.count(old)==1; s=s.replace(old,new); open(p,'w').write(s)
