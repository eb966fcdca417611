#!/usr/bin/env bash
# The host backend under sanitizers (nightly Rust; no GPU, no CUDA):
#
#   1. AddressSanitizer (with LeakSanitizer): the unit tests of shmem and
#      shmem-sys, then the SPMD suite on 1-4 PEs, whose PEs are the same ASan
#      build. In ASan builds every PE also poisons the bytes of the symmetric
#      heap that no live buffer covers (shmem/src/heap/asan.rs), so an access
#      outside a buffer is an ASan error even inside the shared mapping.
#   2. Miri: the unit tests that Miri can run (pure logic and the unsafe code
#      that needs no sockets, processes or mappings; the others are ignored
#      under Miri, each saying why), under Stacked Borrows; then the one test
#      that needs a rayon pool, under Tree Borrows (crossbeam-epoch, under
#      rayon, breaks Stacked Borrows: crossbeam-rs/crossbeam#996).
#
# Installs the nightly toolchain's components it needs (miri, rust-src) with
# rustup when they are missing. Runs every step, prints a summary, and exits
# non-zero if any step failed or any sanitizer reported an error.
#
#   bash ci/sanitize-host.sh            # both
#   bash ci/sanitize-host.sh asan       # or: miri
#
# SHMEM_TEST_WORLDS (e.g. 2,4) picks the SPMD suite's worlds, as for `cargo test`.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1

if ! command -v cargo >/dev/null 2>&1 && [[ -d "$HOME/.cargo/bin" ]]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi

what=${1:-all}
case "$what" in
all | asan | miri) ;;
*)
    echo "usage: $0 [all|asan|miri]" >&2
    exit 2
    ;;
esac

# The device kernels play no part on the host backend: skip nvcc.
export SHMEM_NO_KERNELS=${SHMEM_NO_KERNELS:-1}
export CARGO_TERM_COLOR=never

log_dir=$(mktemp -d "${TMPDIR:-/tmp}/shmem-sanitize.XXXXXX")
start_all=$(date +%s)
summary=()
failed=0

# Runs "$@" as step $1 (a name), output to the terminal and to a log;
# records its status, its test counts and the sanitizer errors in its log.
step() {
    local name=$1
    shift
    local log="$log_dir/$name.log" t0 rc
    printf '\n==> [%s] %s\n' "$(date -u +%H:%M:%S)" "$name: $*"
    t0=$(date +%s)
    "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    local took=$(($(date +%s) - t0))
    # The last "test result" line of each test binary (the SPMD suite's driver
    # prints one per world, then the total: count the total only).
    local passed=0 failed_tests=0 ignored=0
    while read -r p f i; do
        passed=$((passed + p))
        failed_tests=$((failed_tests + f))
        ignored=$((ignored + i))
    done < <(awk '
        /^==== SPMD suite on / { in_world = 1; next }
        /^==== SPMD suite over worlds/ { in_world = 0; next }
        /test result:/ && !in_world {
            match($0, /[0-9]+ passed/); p = substr($0, RSTART, RLENGTH) + 0
            match($0, /[0-9]+ failed/); f = substr($0, RSTART, RLENGTH) + 0
            match($0, /[0-9]+ ignored/); i = substr($0, RSTART, RLENGTH) + 0
            print p, f, i
        }' "$log")
    local sanitizer_errors
    sanitizer_errors=$(grep -cE '^==[0-9]+==ERROR: (Address|Leak)Sanitizer|^error: Undefined Behavior|^error: memory leaked' "$log")
    local verdict=ok
    if ((rc != 0 || sanitizer_errors > 0 || failed_tests > 0)); then
        verdict=FAILED
        failed=1
    fi
    summary+=("$(printf '%-22s %-6s %4d passed %3d failed %3d ignored   %3d sanitizer errors   %4d s' \
        "$name" "$verdict" "$passed" "$failed_tests" "$ignored" "$sanitizer_errors" "$took")")
}

nightly_component() {
    local component=$1
    if ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q "^$component"; then
        echo "installing the nightly toolchain's $component"
        rustup component add "$component" --toolchain nightly
    fi
}

if ! rustup toolchain list | grep -q '^nightly'; then
    echo "installing the nightly toolchain"
    rustup toolchain install nightly --profile minimal || exit 1
fi
nightly_component rust-src || exit 1
if [[ $what != asan ]]; then
    nightly_component miri || exit 1
fi
cargo +nightly --version

if [[ $what != miri ]]; then
    # An explicit --target keeps RUSTFLAGS off the build scripts and proc
    # macros, and the ASan build in target/<triple>/, apart from the others.
    triple=$(rustc +nightly -vV | sed -n 's/^host: //p')
    asan=(env RUSTFLAGS="-Zsanitizer=address" RUSTDOCFLAGS="-Zsanitizer=address"
        ASAN_OPTIONS="detect_leaks=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
        cargo +nightly test --target "$triple")
    step asan-unit "${asan[@]}" -p shmem -p shmem-sys --lib
    step asan-spmd "${asan[@]}" -p shmem --test spmd
fi

if [[ $what != asan ]]; then
    step miri-stacked-borrows cargo +nightly miri test -p shmem -p shmem-sys --lib
    step miri-tree-borrows env MIRIFLAGS="-Zmiri-tree-borrows -Zmiri-ignore-leaks" \
        cargo +nightly miri test -p shmem --lib -- --ignored host::rma::tests::
fi

printf '\n==> sanitizers on the host backend, %d s in all (logs: %s)\n' "$(($(date +%s) - start_all))" "$log_dir"
printf '%s\n' "${summary[@]}"
if ((failed)); then
    echo "==> FAILED" >&2
    exit 1
fi
echo "==> clean"
