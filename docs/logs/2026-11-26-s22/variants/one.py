# Lines one a pass only: `reduce_lines` never takes two lines at once
# and `send_all` loads one line a pass (kLinesUnroll 1). Args: reduce.cuh
# common.cuh.
import sys
r, c = sys.argv[1], sys.argv[2]
s = open(r).read()
old = "        if (base + s < lines) {"
assert old in s
s = s.replace(old, "        if (false) {")
open(r, "w").write(s)
s = open(c).read()
old = "static constexpr int kLinesUnroll = 2;"
assert old in s
s = s.replace(old, "static constexpr int kLinesUnroll = 1;")
open(c, "w").write(s)
