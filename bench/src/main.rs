//! shmem-bench: time per message size of every collective (and of the
//! barrier, put and get), next to the same operation through NCCL and
//! through NVSHMEM's own collectives in the same run; time per token
//! count of the MoE all-to-all-v ops, next to NCCL, and of the MoE layer's
//! deduplicated dispatch and combine; and the overlapped matmuls,
//! sequential against overlapped.
//!
//! Built on its own: `cargo build --release -p shmem-bench` (add
//! `--features mpi` to run it under `mpirun`), as
//! `target/release/shmem-bench`. Run alone it starts itself as `--pes` PEs
//! (2 by default); under `shmemrun`/`mpirun` it runs on the world it is
//! given. PE 0 prints one table per operation, element type and timing
//! mode, and with `--json PATH` writes one JSON object per row (`op`,
//! `impl`, `backend`, `dtype`, `bytes`, `pes`, `graph`, `time_us`,
//! `algbw_gbps`, `busbw_gbps`, `vs_nccl`, `vs_nvshmem`, `vs_memcpy`, for
//! the MoE ops `tokens`, `hidden`, `experts_per_pe`, `topk`,
//! `major_align`, for the MoE layer's also `link_bytes`, `link_gbps`,
//! `logical_bytes`, `logical_gbps`, `vs_2d`, and for the overlapped matmuls `m`, `n`, `k`, `chunks`,
//! `tflops`, `vs_sequential`); rows go to `PATH.partial` as they are
//! measured, so a crash keeps what was done.
//!
//! ```text
//! shmem-bench [--backend host|gpu|auto] [--pes N] [--op all|barrier,put,get,all_reduce,all_gather,
//!             reduce_scatter,broadcast,all_to_all|moe|dispatch,combine,all_to_all_v|
//!             moe_layer|layer_dispatch,layer_combine|overlap|ag_matmul,matmul_rs]
//!             [--dtype f32,f16,bf16] [--impl shmem,nccl,...]
//!             [--min-bytes 8] [--max-bytes 64M] [--iters N] [--warmup 5]
//!             [--graph [--graph-max-bytes 64M]] [--json PATH]
//!             [--tokens 128,4096] [--hidden 7168] [--experts-per-pe 8] [--topk 1] [--major-align 1] [--fp8]
//!             [--m 8192] [--n 8192] [--k 8192] [--chunks 4]
//! ```
//!
//! `--op all` is every operation but the MoE ones, which `--op moe`
//! selects, the MoE layer's, which `--op moe_layer` selects (`--op
//! moe,moe_layer` puts the layer beside the 2D ops and NCCL on the same
//! routes), and the overlapped matmuls, which `--op overlap` selects (at
//! their default size they need about 640 MiB of heap and, on the host
//! backend, minutes of CPU); `--op all,moe,moe_layer,overlap`: everything.
//! Names and groups mix freely.
//!
//! **Sizes and bandwidths** follow nccl-tests. `bytes` is per PE: the
//! buffer of all_reduce, broadcast and all_to_all, the whole output of
//! all_gather, the whole input of reduce_scatter (counts round down to a
//! multiple of the PE count where the buffer is split in blocks). algbw is
//! bytes over time; busbw is algbw times 2(n-1)/n for all_reduce, (n-1)/n
//! for all_gather, reduce_scatter and all_to_all, and 1 for broadcast (root
//! 0), put and get. `--dtype` applies to all_reduce and reduce_scatter
//! (sums, f32 by default), to the MoE ops (bf16 by default) and to the
//! overlapped matmuls (f16 by default); the other data-moving collectives
//! move f32, put and get u32.
//!
//! **MoE ops** ([`shmem::moe`], PyTorch's `all_to_all_vdev*`): `dispatch`
//! is `all_to_all_v_2d`, `combine` is `all_to_all_v_2d_offset` sending the
//! dispatch's output back (its input splits and offsets are the
//! dispatch's out_splits_offsets), `all_to_all_v` the 1D op with each
//! peer's rows of the dispatch. One row per `--tokens` count: each PE
//! sends `tokens × topk` rows of `--hidden` elements, each token to
//! `--topk` distinct experts of the `n × --experts-per-pe`, drawn
//! uniformly from a fixed seed (every PE knows every PE's routes; see
//! `moe.rs`); the dispatch pads each expert's block to
//! `--major-align` rows. `bytes` is what a PE sends: `tokens × topk ×
//! hidden × element` (in the combine each PE sends back what it received:
//! that on average); algbw is bytes over time, busbw algbw × (n-1)/n.
//! Their `nccl` rows are one group of ncclSend/ncclRecv with the same rows
//! per peer, packed by peer (what `torch.distributed.all_to_all_single`
//! with splits does; the combine's permutation back to expert order is not
//! timed); they have no `nvshmem` row.
//!
//! **MoE layer** ([`shmem::MoeAllToAll`], deduplicated: one wire row per
//! (token, destination PE)): `layer_dispatch` is
//! [`MoeAllToAll::dispatch_on_device`], `layer_combine`
//! [`MoeAllToAll::combine_on_device`] of identity experts (the dispatch's
//! view as their output), both capturable, so with graph rows. shmem's
//! default only (`impl` `shmem`), one exchange built per token count for
//! that many tokens, on the same routes as the 2D rows (each token's
//! `--topk` experts are its ids, in the order drawn), so `bytes` is the
//! same `tokens × topk × hidden × element`: the 2D ops' count and
//! DeepEP's low-latency one (`num_selections × hidden × 2` a token, on
//! the sending side) for bf16; algbw and busbw as the MoE ops'. Besides,
//! for PE 0: `link_bytes`, the wire bytes it sends to other PEs (the
//! dispatch: one wire row, `hidden × element` padded to 8 + 8 + 8 ×
//! topk, padded to 16, per (token, distinct destination PE other than
//! itself); the combine: one per token received from another PE, the
//! partial sum going back), `link_gbps` that over the time;
//! `logical_bytes`, DeepEP's normal-mode count (its intranode test's
//! `dispatch_bf16_nvl_recv_bytes = recv_x.numel() × 2`, and
//! `combine_bf16_nvl_send_bytes` the same): the distinct (source PE,
//! token) rows PE 0 receives, its own included, × `hidden × element`, and
//! `logical_gbps` that over the time. `vs_nccl` and `vs_2d` compare
//! with NCCL's and shmem's default row of the 2D counterpart (dispatch,
//! combine) of the same run. Their checks are in `layer.rs`.
//!
//! **FP8 dispatch** (`--fp8`, with `layer_dispatch` selected): rows of
//! `layer_dispatch` of dtype `e4m3`, after the bf16 ones, on the same
//! routes and tokens: [`MoeAllToAll::dispatch_fp8_on_device`] of the bf16
//! tokens, which the gather kernel quantizes to e4m3 with one f32 scale
//! per 128 elements (`shmem::quant`); those cross the links, and the
//! receiver gets the codes and scales (no bf16 view), each checked bit
//! for bit against the host's quantization of the token. `link_bytes`
//! counts the FP8 wire rows (`hidden` codes padded to 4, `⌈hidden/128⌉`
//! scales padded to 8, then the metadata, padded to 16); `bytes` and
//! `logical_bytes` are the bf16 rows' — the logical payload is the tokens
//! delivered, whatever their format on the wire — so the FP8 row's
//! logical GB/s over the bf16 row's is the bf16 time over the FP8 time
//! (DeepEP's tests count FP8 bytes, `hidden + 4 × hidden/128` a token,
//! which would show a faster FP8 dispatch as less bandwidth). Their
//! checks are in `layer_fp8.rs`.
//!
//! **Overlapped matmuls** ([`shmem::overlap`]): `ag_matmul` is
//! [`Context::all_gather_matmul`] (each PE's shard of `--m / n` rows of
//! `--k`, gathered into `m × k` and multiplied by its own `k × --n`),
//! `matmul_rs` [`Context::matmul_reduce_scatter`] (each PE's `m × k` times
//! its `k × n`, reduce-scattered into `m / n × n` per PE). Rows, by
//! `impl`: `sequential` (the collective, then one GEMM), `overlap_sm` and
//! `overlap_ce` (chunks moved by an SM kernel or by copy engines beside
//! the GEMMs; one row per `--chunks` count), `gemm_only` (the op's `m × k`
//! by `k × n` GEMM alone: all_gather_matmul on a team of this PE only, in
//! place, so nothing moves but the call's fixed costs stay; the floor an
//! overlap can reach). `bytes` is
//! one PE's block: its shard (ag_matmul; 64 MiB at the defaults over 2
//! PEs in f16) or its block of the output (matmul_rs); `tflops` is `2 m n
//! k` over the time; `vs_sequential` is sequential's time over this row's.
//! Their checks and timing inputs are in `overlap.rs`. On the
//! host backend the three run the same code (the collective, then a host
//! matmul). No graph rows: the calls cannot be captured.
//!
//! **Implementations** (`impl`): on the GPU backend `shmem` is the default
//! [`shmem::Collectives`]; `shmem-oneshot`, `shmem-twoshot`, `shmem-ll`,
//! `shmem-push` force an all-reduce algorithm, `shmem-ce` the copy-engine all-gather,
//! `shmem-rma` NVSHMEM's RMA inside the kernels; `nvshmem` is NVSHMEM's own
//! collective and `nccl` NCCL's (cudarc's bindings to the box's libnccl, on
//! plain device buffers; all_to_all as grouped sends and receives), both
//! with the same dtype and sizes (the MoE ops: `shmem` and `nccl` only).
//! `memcpy` is the reference of put and get: a copy-engine copy to or
//! from the peer's memory (GPU) or a memcpy (host). The host backend
//! ignores the collective settings, so it has only `shmem` (and `memcpy`)
//! rows. `vs X` is X's time over ours, for the `shmem*` rows: above 1,
//! shmem is faster.
//!
//! **Timing** (PE 0's clock): eager, on the GPU backend, CUDA events around
//! 5 batches of `--iters` back-to-back operations, each batch started by a
//! barrier, after `--warmup` untimed ones: the median batch's mean; on the
//! host backend the median of single timed operations, each after a
//! barrier (barriers themselves back to back). An eager GPU row's JSON
//! also has `issue_us`, the host's time to issue one operation in that
//! batch: well under `time_us`, the row is bound by the device. Near it,
//! by the host, or by the device once the driver's launch queue is full
//! (the host then waits in the launch): a batch is up to 1000 operations.
//! `--gated` tells the two apart: 5 more batches of 64 operations each,
//! issued while the stream waits on a device word (`cuStreamWaitValue32`)
//! and let go after the last: `issue_us` is then the host's cost alone, and
//! `device_us` the device's per operation with every launch queued ahead.
//! An operation that waits for its stream on the host would wait for the
//! gate: a watchdog lets it go after 2 s, and the row has no gated times.
//! With `--gated`, PE 0 first prints the floor of such a row: an empty
//! kernel launched behind the same gate in this process, with and without
//! programmatic dependent launch (`launch floor`).
//! `--graph` (GPU) captures 100
//! operations in a CUDA graph and times replays with events, each after a
//! barrier (after 3 untimed): the median of 5, per operation, for sizes up
//! to `--graph-max-bytes`; every implementation but `nvshmem`, whose
//! collectives are called from the host (the MoE ops are captured too).
//!
//! **Checks**: before timing, each row's output is poisoned (all-ones
//! bytes: NaN, `u32::MAX`), the operation runs once, and every element is
//! compared with the exact expected value; after timing it is compared
//! again. Inputs are small integers, exact in the dtype, that name the
//! sending PE (`pe + 1 + n·r` with `r` pseudo-random per index and size;
//! the MoE ops' index is row × hidden + column of the sender's input, and
//! `r` takes as many values as stay exact, since nothing is summed). The
//! MoE ops' data rows are compared (padding rows, never written, are not),
//! and so is their out_splits_offsets (poisoned to -1), with the values
//! the host computes from the known splits. The MoE layer's dispatch is
//! checked the same way (its view's data rows, and its splits and offsets,
//! `device_layout`); its combine's output against the sums the layer
//! defines, computed on the host (with its weights, powers of two summing
//! to 1, the tokens themselves in f32).
//! A wrong result is reported with the op, impl, size and PE, its row is
//! left out, and the run exits non-zero. An implementation that fails (an
//! unsupported size, a capture it cannot be part of) is noted on stderr and
//! its row left out; every PE agrees on each row before going on.
//!
//! **Heap**: unless `SHMEM_HEAP_SIZE` is set, 4 × `--max-bytes` (source,
//! destination and the collectives' scratch) where `--op all` ops run, or
//! what the MoE ops or the overlapped matmuls take where that is more
//! (each group runs after the others have freed theirs), + 64 MiB. The MoE ops take, at the largest token
//! count and in the widest dtype, `2 × tokens × topk` rows (the dispatch's
//! input, the combine's output) and the dispatch's output: the most rows
//! any PE receives, with padding, which the host computes from the routes
//! before `init` over the launcher's world size (`SHMEM_WORLD_SIZE`,
//! `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE`; else `--pes`). Defaults over 8 PEs,
//! bf16: about 3 × 56 MiB. The overlapped matmuls take, per PE, in the
//! widest dtype: ag_matmul `m k + m n + (m / n_pes) k + k n` elements
//! (a_out, out, shard, b: 448 MiB at the defaults in f16 over 2 PEs),
//! matmul_rs `m k + k n + (m / n_pes) n + 2 m n` (a, b, out, workspace:
//! 576 MiB). The MoE layer takes, at the largest token count, in the
//! widest dtype, what `MoeAllToAll::new` allocates (`memory_bytes`: wire
//! rows out, `tokens × min(topk, n)`, and in, `tokens × n`; the view,
//! `tokens × n × min(topk, experts_per_pe)` rows of `hidden` and each
//! expert's padding) and the bench's inputs and output (`2 × tokens`
//! rows); with `--fp8` also the FP8 exchange's own buffers (the
//! combine's partials, `tokens × n` rows, and the view's codes and
//! scales). Rows that do not fit are noted (with what they need) and
//! left out.
//!
//! [`MoeAllToAll::dispatch_on_device`]: shmem::MoeAllToAll::dispatch_on_device
//! [`MoeAllToAll::combine_on_device`]: shmem::MoeAllToAll::combine_on_device
//! [`MoeAllToAll::dispatch_fp8_on_device`]: shmem::MoeAllToAll::dispatch_fp8_on_device
//! [`Context::all_gather_matmul`]: shmem::Context::all_gather_matmul
//! [`Context::matmul_reduce_scatter`]: shmem::Context::matmul_reduce_scatter

use clap::Parser;
use shmem::launch::Launch;
use shmem::{BackendKind, Config};
use std::cell::{Cell, RefCell};
use std::path::PathBuf;

mod args;
mod bench;
mod collectives;
mod data;
mod harness;
mod layer;
mod layer_fp8;
mod moe;
mod nccl;
mod ops;
mod overlap;
mod put_get;
mod report;

use args::{Args, Backend};
use bench::Bench;
use ops::{Op, COLLECTIVES, LAYER, MOE};
use report::{note, print_table};

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

const HEAP_ENV: &str = "SHMEM_HEAP_SIZE";

/// The symmetric heap the bench needs over `n` PEs, and some slack: for
/// the `--op all` group, source, destination and the collectives' scratch,
/// each up to the largest message; for the MoE ops, see
/// [`moe::heap_bytes`]; for the MoE layer, [`layer::heap_bytes`]; for the
/// overlapped matmuls, [`overlap::heap_bytes`] (rows made one group after
/// the other, so the largest of them).
fn heap_bytes(args: &Args, n: usize) -> usize {
    let all = match COLLECTIVES.iter().chain(&[Op::Barrier, Op::Put, Op::Get]).any(|op| op.selected_by(&args.op)) {
        true => args.max_bytes.saturating_mul(4),
        false => 0,
    };
    let moe = match MOE.iter().any(|op| op.selected_by(&args.op)) {
        true => moe::heap_bytes(args, n),
        false => 0,
    };
    let layer = match LAYER.iter().any(|op| op.selected_by(&args.op)) {
        true => layer::heap_bytes(args, n),
        false => 0,
    };
    all.max(moe).max(layer).max(overlap::heap_bytes(args, n)).saturating_add(64 << 20)
}

/// The world's size before `init`, for the heap: from the launcher's
/// environment (shmemrun, mpirun), else `--pes`.
fn world_size_hint(args: &Args) -> usize {
    [shmem::bootstrap::env::WORLD_SIZE, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
        .unwrap_or(args.pes as usize)
}

fn main() {
    let args = Args::parse();
    if args.min_bytes > args.max_bytes || args.min_bytes % 4 != 0 {
        // Sizes double from the minimum, so all are whole u32 and f32 counts.
        eprintln!(
            "shmem-bench: --min-bytes ({}) must be a multiple of 4 and at most --max-bytes ({})",
            args.min_bytes, args.max_bytes
        );
        std::process::exit(2);
    }
    if !shmem::bootstrap::started_by_launcher() {
        std::process::exit(relaunch(&args));
    }
    if let Err(e) = run(&args) {
        note(format_args!("failed: {e}"));
        std::process::exit(1);
    }
}

/// Runs this program again, with the same arguments, as `--pes` PEs.
fn relaunch(args: &Args) -> i32 {
    let pes = args.pes as usize;
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("shmem-bench: cannot find my own executable: {e}");
            return 1;
        }
    };
    // Untagged: only PE 0 prints, and the table should stay copy-pastable.
    let mut launch = Launch::new(pes, exe).args(std::env::args_os().skip(1)).tag_output(false).kill_on_failure(true);
    if std::env::var_os(HEAP_ENV).is_none() {
        launch = launch.env(HEAP_ENV, heap_bytes(args, pes).to_string());
    }
    match launch.run() {
        Ok(outcome) => outcome.exit_code(),
        Err(e) => {
            eprintln!("shmem-bench: launching {pes} PEs failed: {e}");
            1
        }
    }
}

fn run(args: &Args) -> Res {
    let backend = match args.backend {
        Backend::Host => BackendKind::Host,
        Backend::Gpu => BackendKind::Gpu,
        Backend::Auto => BackendKind::Auto,
    };
    let mut config = Config::new().backend(backend);
    if std::env::var_os(HEAP_ENV).is_none() {
        config = config.heap_size(heap_bytes(args, world_size_hint(args)));
    }
    let ctx = config.init()?;
    let (me, n) = (ctx.my_pe(), ctx.n_pes());
    let backend = format!("{:?}", ctx.backend()).to_lowercase();
    let partial = args.json.as_ref().map(|p| {
        let mut s = p.as_os_str().to_owned();
        s.push(".partial");
        PathBuf::from(s)
    });
    let (rows, wrong) = {
        let bench = Bench {
            ctx: &ctx,
            s: ctx.stream(),
            args,
            sizes: std::iter::successors(Some(args.min_bytes), |&b| b.checked_mul(2))
                .take_while(|&b| b <= args.max_bytes)
                .collect(),
            verdicts: ctx.alloc_zeroed::<u32>(n)?,
            net_words: ctx.alloc_zeroed::<u64>(n)?,
            wrong: Cell::new(0),
            issue_us: Cell::new(None),
            device_us: Cell::new(None),
            partial: RefCell::new(match (&partial, me) {
                (Some(p), 0) => Some(std::fs::File::create(p).map_err(|e| format!("creating {}: {e}", p.display()))?),
                _ => None,
            }),
            backend: backend.clone(),
        };
        if args.graph && !bench.gpu() && me == 0 {
            note("--graph needs the gpu backend: no graph rows");
        }
        if let (true, Some(stream), 0) = (args.gated, bench.s.cuda_stream(), me) {
            match harness::launch_floor(stream) {
                Ok([pdl, plain]) => note(format_args!(
                    "launch floor (an empty kernel, gated): issue {:.2} µs and device {:.2} µs a launch with \
                     programmatic dependent launch, {:.2} / {:.2} without",
                    pdl.1, pdl.0, plain.1, plain.0
                )),
                Err(e) => note(format_args!("launch floor: not measured ({e})")),
            }
        }
        (bench.all()?, bench.wrong.get())
    };

    if me == 0 {
        print_table(&rows, n, &backend, args);
        if let Some(path) = &args.json {
            let out: String = rows.iter().map(|r| r.json(n, &backend, Some(&rows)) + "\n").collect();
            std::fs::write(path, out).map_err(|e| format!("writing {}: {e}", path.display()))?;
            if let Some(p) = &partial {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    // After the results are out: a fault in teardown cannot lose them.
    ctx.finalize()?;
    if wrong > 0 {
        return Err(format!("{wrong} wrong result(s) on PE {me} (see above)").into());
    }
    Ok(())
}
