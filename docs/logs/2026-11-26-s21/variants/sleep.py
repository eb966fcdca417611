import sys
p=sys.argv[1]; ns=sys.argv[2]; s=open(p).read()
old="""            if (live) ld_volatile_v2u64(p, a, b);
        }
    }"""
assert s.count(old)==1
s=s.replace(old,"""            __nanosleep(%s);
            if (live) ld_volatile_v2u64(p, a, b);
        }
    }""" % ns)
open(p,'w').write(s)
