# v5: the whole-line loads and stores (`LinesOf::whole`) not taken by the
# MoE line kernel's lines (`kRolled`), as before run 2. Arg: common.cuh.
import sys
p = sys.argv[1]
s = open(p).read()
for old in ["        if (live && whole(p, len, line)) {", "        if (whole(p, len, line)) {"]:
    assert s.count(old) == 1, old
    s = s.replace(old, old.replace("if (", "if (!kRolled && "))
open(p, "w").write(s)
