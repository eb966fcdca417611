//! The command line: the flags, the element types they name, and the
//! kernels' tuning they ask for.

use crate::ops::{Imp, Op};
use clap::{Parser, ValueEnum};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(about = "Time shmem's collectives, barrier, put and get against NCCL, NVSHMEM and memcpy")]
pub(super) struct Args {
    /// Backend to measure
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    pub(super) backend: Backend,
    /// Operations to measure (comma-separated)
    #[arg(long, value_enum, value_delimiter = ',', default_value = "all")]
    pub(super) op: Vec<Op>,
    /// Element types of all_reduce and reduce_scatter [default: f32], of
    /// the MoE ops [default: bf16] and of the overlapped matmuls [default:
    /// f16] (comma-separated)
    #[arg(long, value_enum, value_delimiter = ',')]
    pub(super) dtype: Vec<Dtype>,
    /// Implementations to measure (comma-separated) [default: all]
    #[arg(long = "impl", value_enum, value_delimiter = ',')]
    pub(super) imp: Vec<Imp>,
    /// Smallest message: bytes, a multiple of 4 (K, M, G suffixes allowed)
    #[arg(long, default_value = "8", value_parser = parse_bytes)]
    pub(super) min_bytes: usize,
    /// Largest message; sizes double from --min-bytes up to it
    #[arg(long, default_value = "64M", value_parser = parse_bytes)]
    pub(super) max_bytes: usize,
    /// Timed iterations per size [default: enough to move 256 MiB, within 10..=1000]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) iters: Option<u64>,
    /// Untimed iterations before timing each size
    #[arg(long, default_value_t = 5)]
    pub(super) warmup: usize,
    /// Eager GPU rows: also time gated batches, where the stream waits on a
    /// device word while the host issues 64 operations, then is let go (the
    /// host's cost alone as `issue_us`, the device's with every launch
    /// queued ahead as `device_us`)
    #[arg(long)]
    pub(super) gated: bool,
    /// Also write the rows here, one JSON object per line
    #[arg(long)]
    pub(super) json: Option<PathBuf>,
    /// PEs to start when run on its own
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) pes: u64,
    /// GPU backend: also time replays of CUDA graphs of 100 operations
    #[arg(long)]
    pub(super) graph: bool,
    /// Largest message timed in graph mode
    #[arg(long, default_value = "64M", value_parser = parse_bytes)]
    pub(super) graph_max_bytes: usize,
    /// MoE ops: tokens per PE, one row per count (comma-separated)
    #[arg(long, value_delimiter = ',', default_value = "128,4096", value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) tokens: Vec<u64>,
    /// MoE ops: elements per token row
    #[arg(long, default_value_t = 7168, value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) hidden: u64,
    /// MoE ops: experts on each PE
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) experts_per_pe: u64,
    /// MoE ops: distinct experts each token goes to
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) topk: u64,
    /// MoE dispatch: each expert's block of rows starts at a multiple of this
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) major_align: u64,
    /// MoE layer: also the FP8 dispatch's rows (`layer_dispatch` of dtype
    /// e4m3: bf16 tokens quantized to e4m3 with one f32 scale per 128
    /// elements on the wire; the receiver gets the codes and scales)
    #[arg(long)]
    pub(super) fp8: bool,
    /// MoE ops: data blocks that copy each PE's own rows while the others
    /// push (`Collectives::moe_local_blocks`; 0: each block does both)
    /// [default: the kernel's choice]
    #[arg(long)]
    pub(super) moe_local_blocks: Option<u32>,
    /// GPU kernels' tuning (`shmem::Tuning`), for every shmem row: the
    /// low-latency kernels' largest message a peer [default: 1M over the
    /// PEs' peers, at least 128K; at most 1M up to 8 PEs]
    #[arg(long, value_parser = parse_bytes)]
    pub(super) ll_max_bytes: Option<usize>,
    /// GPU kernels' tuning: the smallest message a peer that the
    /// low-latency kernels move in 128-byte lines (after LL128; 0: every
    /// message) [default: 256K]
    #[arg(long, value_parser = parse_bytes_or_zero)]
    pub(super) ll_lines_min_bytes: Option<usize>,
    /// GPU kernels' tuning: blocks of the low-latency kernels [default: 16
    /// below 32K a peer, 128 from there]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=128))]
    pub(super) ll_blocks: Option<u32>,
    /// GPU kernels' tuning: threads a block of the low-latency kernels, in
    /// whole warps, at most 512 for packets and 640 for lines [default:
    /// 512 for packets; for lines, the warps for one pass, 256 to 640]
    #[arg(long, value_parser = clap::value_parser!(u32).range(32..=640))]
    pub(super) ll_threads: Option<u32>,
    /// GPU kernels' tuning: blocks of the push kernels [default: 64]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=128))]
    pub(super) push_blocks: Option<u32>,
    /// GPU kernels' tuning: MoE bytes of the busiest PE's rows per working
    /// data block (the line kernel: of the input per block) [default: 32K;
    /// the line kernel: 7168]
    #[arg(long, value_parser = parse_bytes)]
    pub(super) moe_block_bytes: Option<usize>,
    /// GPU kernels' tuning: the largest MoE input (bytes of a PE's input
    /// rows) that the default form moves in 128-byte lines where they fit
    /// [default: every input]
    #[arg(long, value_parser = parse_bytes)]
    pub(super) moe_lines_max_bytes: Option<usize>,
    /// GPU kernels' tuning: the most bytes of rows for the team's
    /// `PEs × max_tokens` tokens that the layer's decode form sends in
    /// 128-byte lines (0: never) [default: 512K for the dispatch, 2M for
    /// the combine]
    #[arg(long, value_parser = parse_bytes_or_zero)]
    pub(super) moe_layer_lines_max_bytes: Option<usize>,
    /// GPU kernels' tuning: at 1 PE, the smallest collective (bytes of its
    /// destination) copied by a copy engine rather than by a kernel (0:
    /// every one) [default: every one in a graph; else 2M for all_reduce
    /// and reduce_scatter, 8M for the others]
    #[arg(long, value_parser = parse_bytes_or_zero)]
    pub(super) solo_ce_min_bytes: Option<usize>,
    /// GPU kernels' tuning: the smallest broadcast (bytes) that the
    /// members pull from the root over NVLink rather than the root pushing
    /// it [default: none]
    #[arg(long, value_parser = parse_bytes_or_zero)]
    pub(super) pull_bcast_min_bytes: Option<usize>,
    /// GPU kernels' tuning: the smallest broadcast (bytes) of three or
    /// more PEs over NVLink that the members relay (each of n−1 members
    /// reads its share of the root's source and stores it into every
    /// non-root) rather than the root pushing it to every member
    /// [default: past 1M]
    #[arg(long, value_parser = parse_bytes_or_zero)]
    pub(super) relay_bcast_min_bytes: Option<usize>,
    /// ag_matmul, matmul_rs: rows of a (ag_matmul: once gathered, each PE's
    /// shard is m / PEs rows; matmul_rs: each PE's out is m / PEs rows)
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) m: u64,
    /// ag_matmul, matmul_rs: columns of b and of out
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) n: u64,
    /// ag_matmul, matmul_rs: columns of a, rows of b
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) k: u64,
    /// ag_matmul, matmul_rs: chunks each PE's block moves in; one row of
    /// each overlapped implementation per count (comma-separated)
    #[arg(long, value_delimiter = ',', default_value = "4", value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) chunks: Vec<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(super) enum Backend {
    Host,
    Gpu,
    Auto,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(super) enum Dtype {
    F32,
    F16,
    Bf16,
}

impl Args {
    /// The kernels' tuning that the flags ask for.
    pub(super) fn tuning(&self) -> shmem::Tuning {
        shmem::Tuning {
            low_latency_max_bytes: self.ll_max_bytes,
            low_latency_blocks: self.ll_blocks,
            low_latency_threads: self.ll_threads,
            low_latency_lines_min_bytes: self.ll_lines_min_bytes,
            push_blocks: self.push_blocks,
            moe_block_bytes: self.moe_block_bytes,
            moe_lines_max_bytes: self.moe_lines_max_bytes,
            moe_layer_lines_max_bytes: self.moe_layer_lines_max_bytes,
            solo_copy_engine_min_bytes: self.solo_ce_min_bytes,
            broadcast_pull_min_bytes: self.pull_bcast_min_bytes,
            broadcast_relay_min_bytes: self.relay_bcast_min_bytes,
        }
    }
}

fn parse_bytes(s: &str) -> Result<usize, String> {
    match shmem::config::parse_size(s) {
        Some(n) if n > 0 => Ok(n),
        _ => Err(format!("{s:?} is not a positive size such as 8, 64K or 256M")),
    }
}

/// As [`parse_bytes`], 0 allowed (a threshold that every message passes).
fn parse_bytes_or_zero(s: &str) -> Result<usize, String> {
    shmem::config::parse_size(s).ok_or_else(|| format!("{s:?} is not a size such as 0, 8, 64K or 256M"))
}
