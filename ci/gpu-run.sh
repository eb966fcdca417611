#!/usr/bin/env bash
# Runs on the GPU box, from a carried .gpu-bundle/ (see gpu-bundle.sh):
# the SPMD suite on the gpu backend with 2 PEs under shmemrun (each
# collective's test alone), under mpirun and with RMA forced, and over
# NVSHMEM's remote transport where the box has an RDMA device, then the
# examples (and, with --bench, the benchmark sweep; with --quick, only the
# collectives' tests; with --moe, only the MoE tests and examples; with
# --overlap, only the overlapped matmuls' tests, examples and bench rows;
# with --faults, only the fault scenarios; with --soak, only the soak
# example; with --sanitize, only the SPMD suite under compute-sanitizer;
# with --tune, only the kernels' tuning sweep; with --share, any of these
# with the PEs sharing the box's GPUs under CUDA MPS, for a box with fewer
# GPUs than PEs, less what needs NCCL). Where it wrote benchmark rows, the
# issues' targets met or missed by them are in targets.txt (targets.py).
# Finds the box's NVSHMEM by itself. Logs go to $OUT (or ./gpu-out); exits
# non-zero if any step failed.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=$here/bin
# Run from the repository (ci/gpu-run.sh) on a machine with cargo: build the
# bundle's binaries first, and run the bundle's copy of this script.
if [[ ! -d "$bin" && ! -f "$here/bin.tar.xz" && -f "$here/gpu-bundle.sh" ]]; then
    bash "$here/gpu-bundle.sh" --no-archive || exit 1
    exec bash "$here/../.gpu-bundle/gpu-run.sh" "$@"
fi
# gpu-bundle.sh packs the binaries into one archive.
if [[ -f "$here/bin.tar.xz" && ! -d "$bin" ]]; then
    tar -C "$here" -xJf "$here/bin.tar.xz" || { echo "gpu-run: cannot unpack $here/bin.tar.xz" >&2; exit 1; }
fi
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
log=$out/gpu-run.log
: >"$log"

if ! . "$here/gpu-env.sh"; then
    echo "gpu-run: the GPU environment is incomplete (above)" | tee -a "$log"
    exit 1
fi
export SHMEM_BACKEND=gpu
# The collectives' tests name each case before running it (a hang names its case).
export SHMEM_TEST_TRACE=${SHMEM_TEST_TRACE:-1}
pes=${SHMEM_GPU_PES:-2}
# --nodes K: every job on K emulated nodes of $pes / K PEs (SHMEM_NODE_ID).
nodes=1
for ((i = 1; i <= $#; i++)); do
    [[ ${!i} == --nodes ]] && { j=$((i + 1)); nodes=${!j:-}; }
done
if ! [[ $nodes =~ ^[1-9][0-9]*$ ]] || ((pes % nodes)); then
    echo "gpu-run: --nodes $nodes: want a number of nodes that divides $pes PEs (SHMEM_GPU_PES)" >&2
    exit 2
fi
run=("$bin/shmemrun" -n "$pes")
((nodes > 1)) && run+=(--nodes "$nodes")

failed=()
# What a step that is about to be killed for taking too long is doing: the
# GPUs' load, and where each of our processes' threads wait in the kernel
# (a device spin shows as a busy GPU and threads in the CUDA driver; a
# host-side wait as an idle GPU and threads in futex/poll).
hang_report() {
    {
        printf '==== still running after %s s; what it is doing:\n' "$1"
        nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
        for p in $(pgrep -f "$bin/"); do
            printf 'pid %s (%s):' "$p" "$(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null | cut -c1-120)"
            for t in /proc/"$p"/task/*; do
                printf ' %s=%s' "$(cat "$t"/comm 2>/dev/null)" "$(cat "$t"/wchan 2>/dev/null)"
            done
            printf '\n'
        done
    } >>"$log" 2>&1
}

step() {
    local name=$1
    shift
    printf '\n==== %s: %s\n' "$name" "$*" | tee -a "$log"
    local start=$SECONDS limit=${STEP_TIMEOUT:-300}
    (sleep $((limit > 20 ? limit - 10 : limit)) && hang_report $((limit - 10))) &
    local watcher=$!
    timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    # The watcher's sleep first: killing only the subshell would leave it
    # running (and holding the step's output) until it ends.
    pkill -P "$watcher" 2>/dev/null
    kill "$watcher" 2>/dev/null
    wait "$watcher" 2>/dev/null
    printf '==== %s: exit %d after %d s\n' "$name" "$rc" $((SECONDS - start)) | tee -a "$log"
    ((rc == 0)) || failed+=("$name")
}
mpi=(mpirun --allow-run-as-root --oversubscribe -x SHMEM_BACKEND -x LD_LIBRARY_PATH -x NVSHMEM_HOME
    -x NVSHMEM_DISABLE_NVLS -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x SHMEM_TEST_TRACE)

# Sets `job` to `mpirun` of the command on $pes ranks; on $nodes emulated
# nodes, an MPMD job whose every part is a node (SHMEM_NODE_ID) of
# $pes / $nodes ranks.
mpi_job() {
    job=("${mpi[@]}")
    if ((nodes == 1)); then
        job+=(-np "$pes" "$@")
        return
    fi
    local k
    for ((k = 0; k < nodes; k++)); do
        ((k > 0)) && job+=(:)
        job+=(-np $((pes / nodes)) env SHMEM_NODE_ID="node$k" NVSHMEM_DISABLE_MNNVL=1 "$@")
    done
}

# A command that must fail: within the time limit, non-zero, and with
# `pattern` in the output of each of `count` PEs.
expect_fail() {
    local name=$1 pattern=$2 count=$3
    shift 3
    printf '\n==== %s (must fail on all %s PEs): %s\n' "$name" "$count" "$*" | tee -a "$log"
    local start=$SECONDS tmp
    tmp=$(mktemp)
    timeout --kill-after=10 90 "$@" >"$tmp" 2>&1
    local rc=$? seen
    seen=$(grep -c -- "$pattern" "$tmp")
    cat "$tmp" >>"$log"
    rm -f "$tmp"
    printf '==== %s: exit %d after %d s; %d line(s) name the fault\n' "$name" "$rc" $((SECONDS - start)) "$seen" |
        tee -a "$log"
    if ((rc == 0 || rc == 124 || rc == 137 || seen < count)); then failed+=("$name"); fi
}

# Each test of the SPMD suite whose name matches the extended regex $1,
# as its own step with its own time limit: a slow or stuck test costs only
# itself, and is named.
each_test() {
    local pattern=$1 t
    shift
    for t in $("$bin/spmd" --list 2>/dev/null | sed -n 's/: test$//p' | grep -E "$pattern"); do
        STEP_TIMEOUT=${EACH_TIMEOUT:-240} step "$t" "$@" "$bin/spmd" --exact "$t"
    done
}

# --tune: the kernels' knobs (shmem::Tuning, through shmem-bench's flags)
# against the defaults, in one invocation: the all-reduce (bf16, 32 KiB to
# 1 MiB) with the push kernels on 32, 64 and 128 blocks and with the
# low-latency kernels taking everything up to 1 MiB on 16, 32, 64 and 128
# blocks, and in 128-byte lines (shmem-ll128) on 64 and 128 blocks; the
# other collectives with the low-latency kernels to 1 MiB on 64 blocks,
# and in lines at every size (--ll-lines-min-bytes 0);
# the MoE dispatch with 32, 16 and 8 KiB of rows a block, and in 128-byte
# lines (shmem-lines, where the input fits) with its default of 7680 bytes
# of input a block and with 32 KiB (128 and 56 blocks at 128 tokens). NCCL
# beside the defaults only. Rows in $out/tune-*.jsonl.
tune() {
    local ar=(--op all_reduce --dtype bf16 --min-bytes 32K --max-bytes 1M --graph)
    local coll=(--op all_gather,reduce_scatter,broadcast,all_to_all --dtype bf16 --min-bytes 32K --max-bytes 1M --graph)
    local moe=(--op dispatch --tokens 1,128,4096 --graph)
    local bench=("${run[@]}" "$bin/shmem-bench" --backend gpu)
    export STEP_TIMEOUT=${BENCH_TIMEOUT:-150}
    step tune-ar-default "${bench[@]}" "${ar[@]}" --impl shmem,nccl --json "$out/tune-ar-default.jsonl"
    for b in 32 128; do
        step "tune-ar-push$b" "${bench[@]}" "${ar[@]}" --impl shmem --push-blocks "$b" --json "$out/tune-ar-push$b.jsonl"
    done
    for b in 16 32 64 128; do
        step "tune-ar-ll1m-$b" "${bench[@]}" "${ar[@]}" --impl shmem --ll-max-bytes 1M --ll-blocks "$b" \
            --json "$out/tune-ar-ll1m-$b.jsonl"
    done
    for b in 64 128; do
        step "tune-ar-ll128-$b" "${bench[@]}" "${ar[@]}" --impl shmem-ll128 --ll-blocks "$b" \
            --json "$out/tune-ar-ll128-$b.jsonl"
    done
    step tune-coll-default "${bench[@]}" "${coll[@]}" --impl shmem,nccl --json "$out/tune-coll-default.jsonl"
    step tune-coll-ll1m-64 "${bench[@]}" "${coll[@]}" --impl shmem --ll-max-bytes 1M --ll-blocks 64 \
        --json "$out/tune-coll-ll1m-64.jsonl"
    step tune-coll-lines "${bench[@]}" "${coll[@]}" --impl shmem --ll-lines-min-bytes 0 \
        --json "$out/tune-coll-lines.jsonl"
    step tune-moe-default "${bench[@]}" "${moe[@]}" --impl shmem,nccl --json "$out/tune-moe-default.jsonl"
    for kib in 16 8; do
        step "tune-moe-$kib"k "${bench[@]}" "${moe[@]}" --impl shmem --moe-block-bytes "${kib}K" \
            --json "$out/tune-moe-${kib}k.jsonl"
    done
    step tune-moe-lines "${bench[@]}" "${moe[@]}" --impl shmem-lines --json "$out/tune-moe-lines.jsonl"
    step tune-moe-lines-32k "${bench[@]}" "${moe[@]}" --impl shmem-lines --moe-block-bytes 32K \
        --json "$out/tune-moe-lines-32k.jsonl"
    unset STEP_TIMEOUT
}

# --faults: the SPMD suite's scenario::sigkill_in_* tests, each alone. The
# suite's own PE runs on the host backend and launches a job of $pes PEs
# on the gpu backend in which PE 1 is killed by SIGKILL in the middle of a
# barrier, an all-reduce or a MoE dispatch (all_to_all_v_2d); the test
# passes when every survivor failed (exit 5) with the dead PE named, a
# trapped device wait or a timed-out wait, within 17 s of the kill, and the
# job left nothing named after its PEs in /dev/shm. Here, besides: each
# survivor's output must say so ("PE 1 died", or the device's "waited too
# long for a peer", or "timed out"), and /dev/shm must hold nothing new.
faults() {
    local t r start before after new
    before=$(find /dev/shm -mindepth 1 -maxdepth 1 -printf '%f\n' | sort)
    # On emulated nodes, the scenarios across nodes (jobs of 2 nodes × 2
    # PEs, whose tests check every survivor's error themselves).
    local pick='^scenario::sigkill_in_'
    ((nodes > 1)) && pick='^scenario::sigkill_across_nodes_'
    for t in $("$bin/spmd" --list 2>/dev/null | sed -n 's/: test$//p' | grep -E "$pick"); do
        start=$(wc -l <"$log")
        STEP_TIMEOUT=${EACH_TIMEOUT:-240} step "$t" env SHMEM_BACKEND=host SHMEM_TEST_SCENARIO_BACKEND=gpu \
            SHMEM_TEST_FAULT_PES="$pes" "$bin/shmemrun" -n 1 "$bin/spmd" --exact "$t"
        ((nodes > 1)) && continue
        for ((r = 0; r < pes; r++)); do
            ((r == 1)) && continue # the victim (VICTIM in tests/spmd/scenarios.rs)
            if ! tail -n +"$((start + 1))" "$log" | grep -qE "\[$r\] .*(PE 1 died|stopped waiting for a peer|timed out)"; then
                echo "gpu-run: $t: PE $r's output names neither the dead PE nor a timed-out wait" | tee -a "$log"
                failed+=("$t:pe$r")
            fi
        done
    done
    after=$(find /dev/shm -mindepth 1 -maxdepth 1 -printf '%f\n' | sort)
    new=$(comm -13 <(echo "$before") <(echo "$after") | tr '\n' ' ')
    if [[ -n $new ]]; then
        echo "gpu-run: left in /dev/shm by the fault scenarios: $new" | tee -a "$log"
        failed+=(faults-dev-shm)
    fi
}

# The overlapped matmuls' examples: a tensor-parallel layer's step each,
# with copy-engine overlap, checked exactly.
overlap_examples() {
    step all_gather_matmul "${run[@]}" --tag-output "$bin/all_gather_matmul"
    step matmul_reduce_scatter "${run[@]}" --tag-output "$bin/matmul_reduce_scatter"
}

# --soak: the soak example (examples/soak.rs) with its default counts:
# 100000 collectives and 10000 replays of a captured MoE dispatch, checked,
# then this PE's device memory in use must equal, and its RSS be within
# 8 MiB of, what they were after the warm-up. PE 0 writes $out/soak.json.
soak() {
    if [[ ! -x "$bin/soak" ]]; then
        echo "gpu-run: $bin/soak is missing (a bundle from before examples/soak.rs)" | tee -a "$log"
        failed+=(soak)
        return
    fi
    STEP_TIMEOUT=${SOAK_TIMEOUT:-420} step soak "${run[@]}" --tag-output "$bin/soak" --json "$out/soak.json"
}

# --sanitize: SPMD tests under compute-sanitizer, memcheck (out-of-bounds
# and misaligned device accesses, device errors) and racecheck
# (shared-memory hazards); SAN_TOOLS="racecheck" (say) runs fewer. The tests
# are those whose names match the extended regex $SANITIZE_TESTS (default:
# every test but the scenarios, which start and kill jobs of their own and
# run on the gpu backend under --faults).
# They run in groups (SAN_GROUPS, one per line: optional VAR=value words,
# then a regex; the default below balances the collectives' long tests and
# repeats the MoE tests with RMA forced), one job per group and tool (one
# NVSHMEM start-up under the sanitizer, about 50 s with memcheck, for many
# tests), SAN_JOBS (default 6) jobs at once: the start-ups contend for the
# GPUs, and many at once start slowly; a test in no group runs in a last
# one. The per-dtype tests run one type of each element size and the
# kernels' three arithmetic families, SAN_DTYPES (default f32,bf16,i64),
# the collectives leave out their 256 MiB cases (SAN_HUGE=1 keeps them),
# and the captured graphs replay SAN_REPLAYS (100) times, not 1000: the
# kernels take the same paths, and the whole matrix would not fit the
# jobs' time limit (SAN_TIMEOUT). shmemrun starts one sanitizer per
# PE, which starts spmd (the launcher's environment passes through);
# --tag-output keeps each PE's report apart. Each job's log is in san/
# (packed into san-logs.tar.xz). A job passes when it exits 0, its tests
# passed, and every PE's report ends in a zero summary ("ERROR SUMMARY: 0
# errors"; racecheck's is "RACECHECK SUMMARY: 0 hazards displayed"). CUDA
# API errors are not reported (SAN_API_ERRORS=explicit reports them):
# NVSHMEM's start-up probes features with calls that are expected to
# fail. The sanitizers slow the kernels, not the device's own wait budget
# (about 10 s of the GPU's clock before a wait for a peer traps): a "waited
# too long" here is slowness as likely as a bug. Host-side waits get the
# job's whole time (SAN_TIMEOUT, 540 s).
san_groups='^coll::all_reduce::|^coll::barrier
^coll::(reduce_scatter|all_gather)::
^coll::(broadcast|all_to_all)::|^coll::graph_replay
^coll::teams::(default|force_rma|one_shot|two_shot)$
^coll::teams::(low_latency|sm|copy_engine|nvshmem)$
^(rma|teams|errors|moe|overlap)::
SHMEM_FORCE_RMA=1 ^moe::'
sanitize() {
    local san=/usr/local/cuda/bin/compute-sanitizer
    [[ -x $san ]] || san=$(command -v compute-sanitizer)
    if [[ -z $san ]]; then
        echo "gpu-run: compute-sanitizer is in neither /usr/local/cuda/bin nor PATH: no sanitizer run" | tee -a "$log"
        failed+=(sanitize)
        return
    fi
    local limit=${SAN_TIMEOUT:-540} jobs=${SAN_JOBS:-6} all tests left dir=$out/san
    all=$("$bin/spmd" --list 2>/dev/null | sed -n 's/: test$//p')
    tests=$(grep -E "${SANITIZE_TESTS:-.}" <<<"$all" | grep -v '^scenario::')
    if [[ -z $tests ]]; then
        echo "gpu-run: no SPMD test matches SANITIZE_TESTS=${SANITIZE_TESTS:-}" | tee -a "$log"
        failed+=(sanitize)
        return
    fi
    mkdir -p "$dir"
    "$san" --version 2>&1 | tail -n 1 | tee -a "$log"
    # Each group: its environment words and its tests.
    local -a envs=() picks=()
    local line words regex pick w
    left=$tests
    while IFS= read -r line; do
        [[ -z $line ]] && continue
        read -ra words <<<"$line"
        regex=${words[-1]}
        unset 'words[-1]'
        pick=$(grep -E "$regex" <<<"$tests")
        [[ -z $pick ]] && continue
        # A group with no environment of its own takes its tests out of
        # the last group's.
        ((${#words[@]} == 0)) && left=$(grep -vxF -f <(printf '%s\n' "$pick") <<<"$left")
        envs+=("${words[*]}")
        picks+=("$pick")
    done <<<"${SAN_GROUPS:-$san_groups}"
    [[ -n $left ]] && {
        envs+=("")
        picks+=("$left")
    }
    local tool k running=0 name
    local -a names=() skips
    for tool in ${SAN_TOOLS:-memcheck racecheck}; do
        for k in "${!picks[@]}"; do
            name=$tool-$k
            names+=("$name")
            # spmd takes one filter but any number of skips: the group is
            # every other test skipped, exactly.
            skips=()
            while IFS= read -r w; do skips+=(--skip "$w"); done < <(grep -vxF -f <(printf '%s\n' "${picks[k]}") <<<"$all")
            {
                printf '==== %s: %s; tests: %s\n' "$name" "${envs[k]:-default settings}" "$(tr '\n' ' ' <<<"${picks[k]}")"
                start=$SECONDS
                # shellcheck disable=SC2086 # the environment words split on purpose
                timeout --kill-after=10 "$limit" env ${envs[k]} SHMEM_TEST_DTYPES="${SAN_DTYPES-f32,bf16,i64}" \
                    SHMEM_TEST_HUGE="${SAN_HUGE:-0}" SHMEM_TEST_REPLAYS="${SAN_REPLAYS:-100}" SHMEM_HEAP_SIZE=2G SHMEM_TEST_WAIT_TIMEOUT="$limit" \
                    SHMEM_PEER_TIMEOUT=120 "${run[@]}" --tag-output \
                    "$san" --tool "$tool" --target-processes all --error-exitcode 99 --print-limit 50 \
                    --report-api-errors "${SAN_API_ERRORS:-no}" "$bin/spmd" --exact "${skips[@]}"
                printf '==== %s: exit %d after %d s\n' "$name" $? $((SECONDS - start))
            } >"$dir/$name.log" 2>&1 &
            running=$((running + 1))
            if ((running >= jobs)); then
                wait -n
                running=$((running - 1))
            fi
        done
    done
    wait
    local r f
    for name in "${names[@]}"; do
        f=$dir/$name.log
        head -n 1 "$f" | tee -a "$log"
        grep -E '^\[0\] test result|^==== .*exit' "$f" | tee -a "$log"
        tail -n 1 "$f" | grep -q ': exit 0 after' || failed+=("$name")
        grep -qE '^\[0\] test result: .*ok' "$f" || {
            echo "gpu-run: $name: no passing test result" | tee -a "$log"
            failed+=("$name")
        }
        for ((r = 0; r < pes; r++)); do
            if ! grep -qE "^\[$r\] =+ (ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards displayed)" "$f"; then
                echo "gpu-run: $name: PE $r's sanitizer reported no clean summary" | tee -a "$log"
                failed+=("$name:pe$r")
            fi
        done
    done
    tar -C "$out" -cJf "$out/san-logs.tar.xz" san && rm -rf "$dir"
}

examples() {
    step quickstart "${run[@]}" --tag-output "$bin/quickstart"
    step ring "${run[@]}" "$bin/ring"
    mpi_job "$bin/allreduce"
    step allreduce "${job[@]}"
    step peer_kernel "${run[@]}" --tag-output "$bin/peer_kernel"
    step device_kernel "${run[@]}" --tag-output "$bin/device_kernel"
    step moe_dispatch_combine "${run[@]}" --tag-output "$bin/moe_dispatch_combine"
    overlap_examples
    [[ -x "$bin/moe_server" ]] && step moe_server "${run[@]}" --tag-output "$bin/moe_server"
    [[ -x "$bin/moe_server" ]] && step moe_server-fp8 "${run[@]}" --tag-output "$bin/moe_server" 1000 --fp8
    # The rest starts jobs of one node.
    ((nodes > 1)) && return
    # Run directly, an example started by spmd_main starts one PE per
    # visible GPU: on 1, 2 and every GPU of the machine.
    local gpus g ex
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    for g in $(printf '%s\n' 1 2 "$gpus" | sort -nu); do
        ((g <= gpus)) || continue
        for ex in quickstart peer_kernel device_kernel moe_dispatch_combine all_gather_matmul matmul_reduce_scatter; do
            step "$ex-direct-$g" env CUDA_VISIBLE_DEVICES="$(seq -s, 0 $((g - 1)))" "$bin/$ex"
        done
    done
    # Bad set-ups: clear errors on every PE, no hang.
    # One PE more than the box's GPUs take (SHMEM_PES_PER_GPU each).
    local over=$(($(nvidia-smi -L 2>/dev/null | grep -c '^GPU') * ${SHMEM_PES_PER_GPU:-1} + 1))
    expect_fail more-pes-than-gpus "GPU(s)" "$over" "$bin/shmemrun" -n "$over" --no-kill --tag-output "$bin/ring"
    expect_fail heap-too-large "heap" "$pes" env SHMEM_HEAP_SIZE=1000G "${run[@]}" --no-kill --tag-output "$bin/ring"
    expect_fail nvshmem-missing "NVSHMEM_HOME" "$pes" env NVSHMEM_HOME=/nonexistent "${run[@]}" --no-kill --tag-output "$bin/ring"
}

step gpus nvidia-smi --query-gpu=index,name,memory.total --format=csv
# Modes, which add up: --quick, the collectives' tests; --suite, the whole
# SPMD suite as one job (SHMEM_FORCE_RMA=1 for every peer on RMA);
# --mpi-suite, the same under mpirun; --nodes K, every job on K emulated
# nodes (on one node what starts one node only); --moe, the MoE
# tests (both paths) and bench rows; --overlap, the overlapped matmuls'
# tests, examples and bench rows; --only REGEX, each test whose name
# matches; --examples, the examples and the failure cases; --faults, the
# PE-killed-by-SIGKILL scenarios (see faults() above); --soak, the soak
# example (see soak() above); --sanitize, SPMD tests under compute-sanitizer
# (see sanitize() above); --tune, the kernels' tuning sweep (see tune()
# above); none of them: everything (the suite three ways, its RMA over
# RDMA, the examples, the failure cases), which has neither the soak nor
# the sanitizers.
quick='' suite='' mpisuite='' moe='' ov='' only='' ex='' fa='' so='' san='' tu='' share=''
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case ${args[i]} in
    --share) share=1 ;;
    --quick) quick=1 ;;
    --suite) suite=1 ;;
    --mpi-suite) mpisuite=1 ;;
    --moe) moe=1 ;;
    --overlap) ov=1 ;;
    --only) only=${args[i + 1]:-} ;;
    --nodes) ((i++)) ;;
    --examples) ex=1 ;;
    --faults) fa=1 ;;
    --soak) so=1 ;;
    --sanitize) san=1 ;;
    --tune) tu=1 ;;
    esac
done
# --share: more PEs than GPUs (a box of one GPU). The PEs share each GPU
# (SHMEM_PES_PER_GPU) under a CUDA MPS daemon of this run's own, so that
# their kernels, which wait on each other, run at once; each gets its share
# of the SMs. It checks the protocols, not the speed: the "NVLink" peers are
# on one GPU, and NCCL refuses two ranks on one GPU, so the steps that need
# NCCL (bench rows, the PyTorch check) are left out.
if [[ -n $share ]]; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    ((gpus > 0)) || { echo "gpu-run: --share: nvidia-smi lists no GPU" | tee -a "$log"; exit 1; }
    per=$(((pes + gpus - 1) / gpus))
    export SHMEM_PES_PER_GPU=$per CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$((100 / per))
    CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d)
    export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY=$out/mps-log
    mkdir -p "$CUDA_MPS_LOG_DIRECTORY"
    if ! nvidia-cuda-mps-control -d >>"$log" 2>&1; then
        echo "gpu-run: --share: the CUDA MPS daemon did not start" | tee -a "$log"
        exit 1
    fi
    trap 'echo quit | nvidia-cuda-mps-control >/dev/null 2>&1' EXIT
    echo "gpu-run: --share: $pes PEs on $gpus GPU(s), $per a GPU, under MPS ($CUDA_MPS_ACTIVE_THREAD_PERCENTAGE% of the SMs each)" |
        tee -a "$log"
    mpi+=(-x SHMEM_PES_PER_GPU -x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)
fi
[[ -n $quick ]] && each_test '^coll::' env SHMEM_HEAP_SIZE=2G "${run[@]}"
# The whole suite as one job (quicker than each collective's test alone).
[[ -n $suite ]] && STEP_TIMEOUT=${SUITE_TIMEOUT:-540} step spmd env SHMEM_HEAP_SIZE=2G "${run[@]}" "$bin/spmd"
if [[ -n $mpisuite ]]; then
    mpi_job env SHMEM_HEAP_SIZE=2G "$bin/spmd"
    STEP_TIMEOUT=${SUITE_TIMEOUT:-540} step spmd-mpirun "${job[@]}"
fi
if [[ -n $moe ]]; then
    step moe env SHMEM_HEAP_SIZE=2G "${run[@]}" "$bin/spmd" moe::
    step moe-forced-rma env SHMEM_FORCE_RMA=1 SHMEM_HEAP_SIZE=2G "${run[@]}" "$bin/spmd" moe::
    [[ -x "$bin/moe_server" ]] && step moe_server "${run[@]}" --tag-output "$bin/moe_server"
    [[ -x "$bin/moe_server" ]] && step moe_server-fp8 "${run[@]}" --tag-output "$bin/moe_server" 1000 --fp8
    # MoE rows of the benchmark: 128 and 4096 tokens × 7168 bf16, 8 experts
    # per PE, top-1: the 2D ops, NCCL and the MoE layer on the same routes.
    [[ -z $share ]] && STEP_TIMEOUT=${BENCH_TIMEOUT:-300} step bench-moe "${run[@]}" "$bin/shmem-bench" \
        --backend gpu --op moe,moe_layer --graph --json "$out/bench-moe.jsonl"
    # The MoE layer's targets (issue 34): 1, 32, 128 and 4096 tokens, top-8,
    # hidden 7168, 8 experts per PE; the FP8 dispatch's rows beside the
    # bf16 ones (--fp8); graph rows at 4096 tokens too (470 MB of bf16
    # rows a PE, past the default --graph-max-bytes).
    [[ -z $share ]] && STEP_TIMEOUT=${BENCH_TIMEOUT:-540} step bench-moe-layer "${run[@]}" "$bin/shmem-bench" \
        --backend gpu --op moe,moe_layer --graph --graph-max-bytes 1G --tokens 1,32,128,4096 --topk 8 --hidden 7168 \
        --experts-per-pe 8 --fp8 --json "$out/bench-moe-layer.jsonl"
    # MOE_LOCAL_BLOCKS="8 16": the same rows of shmem's default form with
    # that many data blocks copying each PE's own rows beside the pushes.
    for lb in ${MOE_LOCAL_BLOCKS:-}; do
        STEP_TIMEOUT=${BENCH_TIMEOUT:-300} step "bench-moe-local-$lb" "${run[@]}" "$bin/shmem-bench" \
            --backend gpu --op moe --graph --impl shmem --moe-local-blocks "$lb" --json "$out/bench-moe-local-$lb.jsonl"
    done
    # PyTorch's all_to_all_vdev_2d on the box (cases written for
    # moe_torch_check, and its timings beside NCCL's), then ours on the same cases.
    torchrun=$(ls /opt/*/.venv/bin/torchrun 2>/dev/null | head -n 1)
    if [[ -n $share ]]; then
        echo "gpu-run: --share: the MoE bench rows and the PyTorch comparison (NCCL) are left out" | tee -a "$log"
    elif ((pes < 2)); then
        # torch.distributed._symmetric_memory.rendezvous refuses a group of one.
        echo "gpu-run: the PyTorch comparison needs 2 PEs or more (PyTorch's symmetric memory refuses one rank): skipped" |
            tee -a "$log"
    elif [[ -n $torchrun ]]; then
        cases=$(mktemp -d)
        STEP_TIMEOUT=${TORCH_TIMEOUT:-240} step torch-a2av-2d "$torchrun" --nproc-per-node "$pes" "$here/torch_a2av_2d.py" --out "$cases" \
            --bench "$out/torch_a2av_2d.jsonl" --bench-iters 1
        step moe-torch-check "${run[@]}" "$bin/moe_torch_check" "$cases"
        rm -rf "$cases"
    else
        echo "gpu-run: no torchrun under /opt/*/.venv: the PyTorch comparison is skipped" | tee -a "$log"
    fi
fi
if [[ -n $ov ]]; then
    each_test '^overlap::' env SHMEM_HEAP_SIZE=2G "${run[@]}"
    [[ -z $ex ]] && overlap_examples # else examples() runs them
    # all_gather_matmul and matmul_reduce_scatter at m = n = k = 8192 (each
    # PE's shard of a: 8192 / pes × 8192, 64 MiB in f16 over 2 PEs):
    # sequential, overlapped by SM kernel and by copy engines at 2, 4 and 8
    # chunks, and the GEMM alone; f16 and bf16. They take 640 MiB of heap.
    [[ -z $share ]] && STEP_TIMEOUT=${BENCH_TIMEOUT:-300} step bench-overlap env SHMEM_HEAP_SIZE=1G "${run[@]}" \
        "$bin/shmem-bench" --backend gpu --op overlap --dtype f16,bf16 --m 8192 --n 8192 --k 8192 --chunks 2,4,8 \
        --json "$out/bench-overlap.jsonl"
fi
[[ -n $only ]] && each_test "$only" env SHMEM_HEAP_SIZE=2G "${run[@]}"
[[ -n $ex ]] && examples
[[ -n $fa ]] && faults
[[ -n $so ]] && soak
[[ -n $san ]] && sanitize
[[ -n $tu && -z $share ]] && tune
[[ -n $tu && -n $share ]] && echo "gpu-run: --share: no tuning sweep (it measures)" | tee -a "$log"
if [[ -z $quick$suite$mpisuite$moe$ov$only$ex$fa$so$san$tu ]]; then
    each_test '^coll::' env SHMEM_HEAP_SIZE=2G "${run[@]}"
    step spmd-shmemrun env SHMEM_HEAP_SIZE=2G "${run[@]}" "$bin/spmd" --skip coll::
    mpi_job env SHMEM_HEAP_SIZE=2G "$bin/spmd" --skip coll::
    step spmd-mpirun "${job[@]}"
    step spmd-forced-rma env SHMEM_FORCE_RMA=1 SHMEM_HEAP_SIZE=2G "${run[@]}" "$bin/spmd" --skip coll::
    # A job of 2 PEs with NVSHMEM's P2P transport off, started by the
    # suite's own PE (on the host backend, holding no GPU): ignored, saying
    # so, on a box without an RDMA device.
    step rma-over-rdma env SHMEM_BACKEND=host "$bin/shmemrun" -n 1 "$bin/spmd" --exact scenario::rma_over_rdma
    examples
fi

for arg in "$@"; do
    if [[ $arg == --bench && -n $share ]]; then
        echo "gpu-run: --share: no benchmark (PEs sharing a GPU measure nothing, and NCCL refuses them)" | tee -a "$log"
    elif [[ $arg == --bench ]]; then
        # Every op and implementation (shmem's variants, NVSHMEM, NCCL), eager
        # from 8 B to 256 MiB per PE and graph-replayed up to 1 MiB; all_reduce
        # and reduce_scatter in f32 and bf16. The heap follows --max-bytes.
        STEP_TIMEOUT=${BENCH_TIMEOUT:-420} step bench "${run[@]}" "$bin/shmem-bench" --backend gpu \
            --op all --dtype f32,bf16 --max-bytes "${BENCH_MAX_BYTES:-256M}" \
            --graph --graph-max-bytes "${BENCH_GRAPH_MAX_BYTES:-1M}" --json "$out/bench.jsonl"
        # The all-gather target: 256 MiB a rank (`bytes` is the whole output).
        STEP_TIMEOUT=${BENCH_TIMEOUT:-300} step bench-ag-target "${run[@]}" "$bin/shmem-bench" --backend gpu \
            --op all_gather --dtype bf16 --min-bytes "$((pes * 256))M" --max-bytes "$((pes * 256))M" --impl shmem,nccl \
            --json "$out/bench-ag-target.jsonl"
        # PyTorch SymmMem's one-shot and two-shot all-reduce (and torch's
        # NCCL) at the same sizes, checked and timed as the bench's rows, in
        # its format: torch-symm.jsonl, which perf_tables.py, plot_perf.py
        # and targets.py read beside bench.jsonl. One node only.
        torch_symm=$here/torch_symm_bench.py
        [[ -f $torch_symm ]] || torch_symm=$here/../ci/torch_symm_bench.py
        torchrun=$(ls /opt/*/.venv/bin/torchrun 2>/dev/null | head -n 1)
        if ((pes < 2 || nodes > 1)); then
            echo "gpu-run: PyTorch's all-reduce rows need 2 PEs or more on one node: skipped" | tee -a "$log"
        elif [[ -z $torchrun ]]; then
            echo "gpu-run: no torchrun under /opt/*/.venv: no PyTorch all-reduce rows" | tee -a "$log"
        elif [[ ! -f $torch_symm ]]; then
            echo "gpu-run: torch_symm_bench.py is in neither the bundle nor ../ci: no PyTorch all-reduce rows" |
                tee -a "$log"
        else
            STEP_TIMEOUT=${TORCH_TIMEOUT:-300} step torch-symm "$torchrun" --nproc-per-node "$pes" "$torch_symm" \
                --dtype f32,bf16 --max-bytes "${BENCH_MAX_BYTES:-256M}" \
                --graph-max-bytes "${BENCH_GRAPH_MAX_BYTES:-1M}" --json "$out/torch-symm.jsonl"
        fi
    fi
done

# The issues' targets, met or missed, from every row this run wrote (and
# the tuning sweep's choices): targets.txt.
if [[ -z $share ]] && compgen -G "$out/*.jsonl" >/dev/null && command -v python3 >/dev/null; then
    python3 "$here/targets.py" "$out" >"$out/targets.txt" 2>&1
    cat "$out/targets.txt" >>"$log"
fi

printf '\n' | tee -a "$log"
if ((${#failed[@]})); then
    echo "gpu-run: FAILED: ${failed[*]}" | tee -a "$log"
    exit 1
fi
echo "gpu-run: every step passed" | tee -a "$log"
