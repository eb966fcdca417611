# The all-reduce by lines with __launch_bounds__(ARG), e.g. "576, 2":
# two blocks an SM, so that the next operation's blocks (programmatic
# dependent launch) can be resident beside this one's.
import sys
p, lb = sys.argv[1], sys.argv[2]
s = open(p).read()
old = "__launch_bounds__(shmem::k::kLinesMaxThreads, 1)                                              \\\n        shmem_allreduce_ll128_"
assert old in s
s = s.replace(old, "__launch_bounds__(%s) \\\n        shmem_allreduce_ll128_" % lb)
open(p, "w").write(s)
