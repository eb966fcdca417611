#!/usr/bin/env bash
# Regenerates src/bindings.rs, the raw bindings to NVSHMEM's host library. The
# bindings are committed: building the workspace needs neither bindgen nor CUDA nor
# NVSHMEM; only this script does.
#
#   shmem-sys/regen.sh        NVSHMEM_HOME and CUDA_HOME from the environment, or,
#                             when unset, from ci/gpu-toolchain.sh (the pinned wheels)
#
# Steps:
#   1. list the functions that $NVSHMEM_HOME/lib/libnvshmem_host.so.3 exports (nm -D);
#   2. keep those matching the patterns below (the host API that shmem uses). A pattern
#      matching no exported function is an error, so a renamed symbol is noticed;
#   3. run bindgen on wrapper.h as C++17, in dynamic-loading mode (struct Nvshmem: one
#      `Result` field per function, so a symbol missing from a library is an error only
#      when used), allowlisting exactly those functions plus the constants' enums;
#   4. check that every selected function made it into the bindings (it must also be
#      declared in the headers), then compile layout_check.cpp against the same headers
#      and print the sizes and offsets that src/layout.rs asserts.
#
# NVSHMEM_HOSTLIB_ONLY is not defined: with nvshmem_host.h as the only include, clang
# parses the headers the same with or without it (checked on 3.4.5), and for a plain
# C++ compiler it only adds nvcc attributes.
set -euo pipefail

BINDGEN_VERSION=0.73.2

crate_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd "$crate_dir/.." && pwd)
out=$crate_dir/src/bindings.rs

log() { printf 'regen: %s\n' "$*" >&2; }

if [[ -z ${NVSHMEM_HOME:-} || -z ${CUDA_HOME:-} ]]; then
    log "NVSHMEM_HOME or CUDA_HOME unset: using ci/gpu-toolchain.sh"
    eval "$("$repo_root/ci/gpu-toolchain.sh")"
fi
lib=$NVSHMEM_HOME/lib/libnvshmem_host.so.3
for path in "$lib" "$NVSHMEM_HOME/include/nvshmem_host.h" "$CUDA_HOME/include/cuda_runtime.h"; do
    [[ -e $path ]] || {
        log "missing $path (check NVSHMEM_HOME and CUDA_HOME)"
        exit 1
    }
done

bindgen=${CARGO_HOME:-$HOME/.cargo}/bin/bindgen
if [[ ! -x $bindgen || $("$bindgen" --version) != "bindgen $BINDGEN_VERSION" ]]; then
    log "installing bindgen-cli $BINDGEN_VERSION"
    cargo install bindgen-cli --version "$BINDGEN_VERSION" --locked
fi

# The host API that shmem uses, as anchored extended regexes over symbol names.
dtypes='float|double|half|bfloat16|int32|int64|uint32|uint64'
int_dtypes='int32|int64|uint32|uint64'
patterns=(
    # initialisation, version, status, teardown
    'nvshmemx_hostlib_init_attr' 'nvshmemx_hostlib_finalize' 'nvshmemx_init_status'
    'nvshmemx_get_uniqueid' 'nvshmemx_set_attr_uniqueid_args'
    'nvshmemx_vendor_get_version_info' 'nvshmem_info_get_version' 'nvshmem_info_get_name'
    'nvshmem_global_exit' 'nvshmem_my_pe' 'nvshmem_n_pes'
    # symmetric heap, peer pointers, registration of local buffers
    'nvshmem_(malloc|calloc|align|free|ptr)'
    'nvshmemx_buffer_(register|unregister|unregister_all)'
    # modules and libraries holding kernels linked with libnvshmem_device.a
    'nvshmemx_cu(module|library)_(init|finalize)'
    # teams
    'nvshmem_team_(my_pe|n_pes|translate_pe|split_strided|split_2d|destroy|get_config|sync)'
    # blocking host RMA, ordering and synchronisation
    'nvshmem_(putmem|getmem)(_nbi)?' 'nvshmem_(quiet|fence|barrier_all|barrier|sync_all)'
    'nvshmem_signal_fetch'
    # stream-ordered RMA, signals and synchronisation
    'nvshmemx_(putmem|getmem)(_nbi)?_on_stream' 'nvshmemx_putmem_signal(_nbi)?_on_stream'
    'nvshmemx_signal_op_on_stream' 'nvshmemx_signal_wait_until_on_stream'
    "nvshmemx_($int_dtypes)_wait_until_on_stream"
    'nvshmemx_(quiet|barrier_all|barrier|sync_all|team_sync)_on_stream'
    # host-initiated atomics on our dtypes
    "nvshmem_($dtypes)_atomic_[a-z_]+"
    # stream-ordered team collectives on our dtypes
    "nvshmemx_($dtypes)_(sum|min|max|prod|and|or|xor)_(reduce|reducescatter)_on_stream"
    "nvshmemx_($dtypes)_(fcollect|broadcast|alltoall)_on_stream"
    "nvshmemx_($dtypes)_(p|g)_on_stream"
    'nvshmemx_(fcollectmem|broadcastmem|alltoallmem)_on_stream'
)

exported=$(nm -D --defined-only "$lib" | awk '$2 == "T" { sub(/@.*/, "", $3); print $3 }' | sort -u)
selected=()
for pattern in "${patterns[@]}"; do
    mapfile -t hits < <(grep -Ex "$pattern" <<<"$exported" || true)
    if ((${#hits[@]} == 0)); then
        log "no function exported by $lib matches '$pattern'"
        exit 1
    fi
    selected+=("${hits[@]}")
done
mapfile -t selected < <(printf '%s\n' "${selected[@]}" | sort -u)
log "${#selected[@]} functions selected of $(wc -l <<<"$exported") exported"
function_regex=$(
    IFS='|'
    echo "${selected[*]}"
)

version=$(sed -n 's/^#define NVSHMEM_VENDOR_\(MAJOR\|MINOR\|PATCH\)_VERSION \([0-9]*\)$/\2/p' \
    "$NVSHMEM_HOME/include/non_abi/nvshmem_version.h" | paste -sd.)
log "generating $out from NVSHMEM $version headers"

# Constants come from C enums; `consts` style gives plain integer constants (a Rust
# enum would be undefined behaviour for a value the library adds later).
"$bindgen" "$crate_dir/wrapper.h" \
    --output "$out" \
    --rust-target 1.85 --rust-edition 2021 \
    --dynamic-loading Nvshmem \
    --allowlist-function "$function_regex" \
    --allowlist-type 'nvshmemx_uniqueid_t|nvshmemx_init_attr_t|nvshmem_team_config_t' \
    --allowlist-type 'nvshmem_team_id_t|nvshmemx_signal_op_t|nvshmemx_cmp_type_t' \
    --allowlist-type 'nvshmemx_status|nvshmemx_init_status_t|flags' \
    --allowlist-var 'NVSHMEM_VENDOR_(MAJOR|MINOR|PATCH)_VERSION|NVSHMEM_TEAM_CONFIG_MASK_.*' \
    --allowlist-var 'NVSHMEM_MAX_NAME_LEN' \
    --default-enum-style consts --no-prepend-enum-name \
    --no-doc-comments --wrap-unsafe-ops \
    --raw-line "// Generated by shmem-sys/regen.sh from the NVSHMEM $version headers; do not edit." \
    -- -x c++ -std=c++17 \
    -I"$NVSHMEM_HOME/include" -I"$CUDA_HOME/include" -I"$CUDA_HOME/include/cccl"

missing=()
for name in "${selected[@]}"; do
    grep -q "^    pub $name:" "$out" || missing+=("$name")
done
if ((${#missing[@]})); then
    log "exported but not declared in the headers, so not bound: ${missing[*]}"
    exit 1
fi
log "wrote $out ($(grep -c '__library.get(b"' "$out") functions)"

work=$(mktemp -d "${TMPDIR:-/tmp}/shmem-sys-regen.XXXXXX")
trap 'rm -rf "$work"' EXIT
g++ -std=c++17 -I"$NVSHMEM_HOME/include" -I"$CUDA_HOME/include" -I"$CUDA_HOME/include/cccl" \
    "$crate_dir/layout_check.cpp" -o "$work/layout_check"
log "layouts in the NVSHMEM $version headers (compare with src/layout.rs):"
"$work/layout_check"
