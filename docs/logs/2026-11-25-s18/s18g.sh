#!/usr/bin/env bash
# Session 18 run 7, two H100s. The final build (9cccca1): run 2's
# torn-line test (`coll::all_to_all::default`) with ten more seeds, then
# every `coll::` test again.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.gpu-bundle" && pwd)
. "$here/../docs/logs/2026-11-25-s12/common.sh"
. "$here/../docs/logs/2026-11-25-s18/common.sh"
torn_test 11 12 13 14 15 16 17 18 19 20
run coll 170 env SHMEM_HEAP_SIZE=2G "$bin/shmemrun" -n 2 "$bin/spmd" coll::
pack
