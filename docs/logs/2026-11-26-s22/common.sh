# Sourced by this session's drivers: session 21's common.sh (the box's
# environment, `run`, `ab_each`, `ab_all`, `ar_at`, `phases_ar`,
# `bench_v`, `sweep`, `gpu_run`, `pack`; old/, phases/ and the variants' vN/
# unpacked where the bundle has them).
. "$here/../docs/logs/2026-11-26-s21/common.sh"
