//! Names of the cubin's kernels as values: a [`KernelId`] is a kernel
//! family with its template arguments (element type, operator, team size,
//! protocol), numbered densely so that the loaded functions are a table
//! indexed by it. The C symbol is spelled only when a kernel is first
//! loaded ([`KernelId::symbol`]).

use super::abi::A2avKind;
use crate::algo::Protocol;
use crate::dtype::{DType, ReduceOp};

/// A data-movement kernel family of `coll/move.cu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Movement {
    AllGather,
    Broadcast,
    AllToAll,
}

impl Movement {
    const ALL: [Movement; 3] = [Movement::AllGather, Movement::Broadcast, Movement::AllToAll];

    fn symbol(self) -> &'static str {
        match self {
            Movement::AllGather => "shmem_allgather",
            Movement::Broadcast => "shmem_broadcast",
            Movement::AllToAll => "shmem_alltoall",
        }
    }
}

/// Every [`Protocol`], in [`KernelId::index`] order.
const PROTOCOLS: [Protocol; 4] = [Protocol::Sm, Protocol::LowLatency, Protocol::LowLatency128, Protocol::Push];

/// A protocol's suffix of a data-movement kernel's name.
fn protocol_suffix(p: Protocol) -> &'static str {
    match p {
        Protocol::Sm => "",
        Protocol::LowLatency => "_ll",
        Protocol::LowLatency128 => "_ll128",
        Protocol::Push => "_push",
    }
}

/// A reduction kernel family of `coll/reduce.cuh`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReduceKernel {
    AllReduceLowLatency,
    /// The eager all-reduce whose data rides its agreement's packets.
    AllReduceAgreed,
    AllReduceLowLatency128,
    AllReducePush,
    AllReduceOneShot,
    AllReduceTwoShot,
    AllReduceTwoShotStores,
    ReduceScatter,
    ReduceScatterLowLatency,
    ReduceScatterLowLatency128,
    ReduceScatterPush,
    /// The node-aware chain in PE order (`coll/reduce_nodes.cuh`).
    AllReduceNodes,
    ReduceScatterNodes,
    /// The node-aware forms in the node-grouped order (`coll/reduce_nodes.cuh`).
    AllReduceGrouped,
    ReduceScatterGrouped,
}

impl ReduceKernel {
    const ALL: [ReduceKernel; 15] = [
        ReduceKernel::AllReduceLowLatency,
        ReduceKernel::AllReduceAgreed,
        ReduceKernel::AllReduceLowLatency128,
        ReduceKernel::AllReducePush,
        ReduceKernel::AllReduceOneShot,
        ReduceKernel::AllReduceTwoShot,
        ReduceKernel::AllReduceTwoShotStores,
        ReduceKernel::ReduceScatter,
        ReduceKernel::ReduceScatterLowLatency,
        ReduceKernel::ReduceScatterLowLatency128,
        ReduceKernel::ReduceScatterPush,
        ReduceKernel::AllReduceNodes,
        ReduceKernel::ReduceScatterNodes,
        ReduceKernel::AllReduceGrouped,
        ReduceKernel::ReduceScatterGrouped,
    ];

    fn symbol(self) -> &'static str {
        match self {
            ReduceKernel::AllReduceLowLatency => "shmem_allreduce_ll",
            ReduceKernel::AllReduceAgreed => "shmem_allreduce_agreed",
            ReduceKernel::AllReduceLowLatency128 => "shmem_allreduce_ll128",
            ReduceKernel::AllReducePush => "shmem_allreduce_push",
            ReduceKernel::AllReduceOneShot => "shmem_allreduce_oneshot",
            ReduceKernel::AllReduceTwoShot => "shmem_allreduce_twoshot",
            ReduceKernel::AllReduceTwoShotStores => "shmem_allreduce_twoshot2",
            ReduceKernel::ReduceScatter => "shmem_reducescatter",
            ReduceKernel::ReduceScatterLowLatency => "shmem_reducescatter_ll",
            ReduceKernel::ReduceScatterLowLatency128 => "shmem_reducescatter_ll128",
            ReduceKernel::ReduceScatterPush => "shmem_reducescatter_push",
            ReduceKernel::AllReduceNodes => "shmem_allreduce_nodes",
            ReduceKernel::ReduceScatterNodes => "shmem_reducescatter_nodes",
            ReduceKernel::AllReduceGrouped => "shmem_allreduce_grouped",
            ReduceKernel::ReduceScatterGrouped => "shmem_reducescatter_grouped",
        }
    }

    /// Whether the family is built for fixed team sizes (a `_{np}`
    /// suffix); the low-latency ones and the node-aware forms take any
    /// world.
    fn sized(self) -> bool {
        !matches!(
            self,
            ReduceKernel::AllReduceLowLatency
                | ReduceKernel::AllReduceAgreed
                | ReduceKernel::AllReduceLowLatency128
                | ReduceKernel::ReduceScatterLowLatency
                | ReduceKernel::ReduceScatterLowLatency128
                | ReduceKernel::AllReduceNodes
                | ReduceKernel::ReduceScatterNodes
                | ReduceKernel::AllReduceGrouped
                | ReduceKernel::ReduceScatterGrouped
        )
    }
}

/// The team size a sized reduction kernel is built for (its `NP`): sums
/// over 2, 4 and 8 PEs have their own, unrolled by the team size; every
/// other reduction runs the kernel for any size (`_0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TeamSize {
    Any,
    Two,
    Four,
    Eight,
}

impl TeamSize {
    const ALL: [TeamSize; 4] = [TeamSize::Any, TeamSize::Two, TeamSize::Four, TeamSize::Eight];

    /// The kernel for `op` over a team of `n` PEs.
    pub(crate) fn of(op: ReduceOp, n: usize) -> TeamSize {
        match (op, n) {
            (ReduceOp::Sum, 2) => TeamSize::Two,
            (ReduceOp::Sum, 4) => TeamSize::Four,
            (ReduceOp::Sum, 8) => TeamSize::Eight,
            _ => TeamSize::Any,
        }
    }

    fn pes(self) -> usize {
        match self {
            TeamSize::Any => 0,
            TeamSize::Two => 2,
            TeamSize::Four => 4,
            TeamSize::Eight => 8,
        }
    }
}

/// Declares the kernels without arguments of their own once, in table
/// order: their names as values ([`Plain`]) and their C symbols. A kernel
/// added here takes the next number of [`KernelId::index`].
macro_rules! plain_kernels {
    ($($(#[$doc:meta])* $name:ident => $symbol:literal,)*) => {
        /// A kernel without arguments of its own.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(crate) enum Plain {
            $($(#[$doc])* $name,)*
        }

        impl Plain {
            /// Every plain kernel, in declaration (table) order.
            const ALL: &[Plain] = &[$(Plain::$name,)*];

            fn symbol(self) -> &'static str {
                match self {
                    $(Plain::$name => $symbol,)*
                }
            }
        }
    };
}

plain_kernels! {
    /// The device's idea of this PE and the world.
    SelfCheck => "shmem_selfcheck",
    Barrier => "shmem_barrier",
    /// The agreement of an eager collective call alone.
    Agree => "shmem_agree",
    BroadcastPull => "shmem_broadcast_pull",
    /// Of `coll/overlap.cu`.
    CopySm => "shmem_copy_sm",
    /// The two-kernel MoE all-to-all-v.
    A2avPlan => "shmem_a2av_plan",
    A2avMove => "shmem_a2av_move",
    /// Of `moe/layer.cu`.
    MoeRoute => "shmem_moe_route",
    MoeGather => "shmem_moe_gather",
    /// A host-initiated atomic through NVSHMEM.
    Amo => "shmem_amo",
    /// The node-aware data movement of `coll/move_nodes.cu`.
    AllGatherNodes => "shmem_allgather_nodes",
    BroadcastNodes => "shmem_broadcast_nodes",
    AllToAllNodes => "shmem_alltoall_nodes",
    /// The node-aware MoE layer's agreement over the world (`moe/layer.cu`).
    MoeAgree => "shmem_moe_agree",
    /// The broadcast relayed by the members.
    BroadcastRelay => "shmem_broadcast_relay",
    /// The flat MoE layer's route over many blocks (`moe/layer.cu`), and
    /// both steps in one launch where its grid is resident at once.
    MoeRank => "shmem_moe_rank",
    MoeStamp => "shmem_moe_stamp",
    MoeRankStamp => "shmem_moe_rank_stamp",
}

/// One kernel of the cubin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KernelId {
    /// A kernel without arguments of its own ([`Plain`]).
    Plain(Plain),
    /// `shmem_sum_slots_{dtype}` of `coll/overlap.cu` (f32, f16, bf16).
    SumSlots(DType),
    /// `shmem_moe_combine_{dtype}` (f32, f64, f16, bf16).
    MoeCombine(DType),
    /// `shmem_moe_decode_{dtype}` of `moe/decode.cu` (f32, f64, f16,
    /// bf16): the MoE layer's decode form, its dispatch and its combine.
    MoeDecode(DType),
    /// `shmem_a2av_fused_{kind}`: the one-kernel MoE all-to-all-v.
    A2avFused(A2avKind),
    /// `shmem_a2av_lines_{kind}`: the MoE line kernel.
    A2avLines(A2avKind),
    /// `shmem_{allgather,broadcast,alltoall}{,_ll,_ll128,_push}`.
    Move(Movement, Protocol),
    /// `{family}_{dtype}_{op}`, and `_{np}` for the sized families.
    Reduce(ReduceKernel, DType, ReduceOp, TeamSize),
}

const DTYPES: usize = DType::ALL.len();
const OPS: usize = ReduceOp::ALL.len();
const KINDS: usize = A2avKind::ALL.len();
const SUM_SLOTS_AT: usize = Plain::ALL.len();
const MOE_COMBINE_AT: usize = SUM_SLOTS_AT + DTYPES;
const MOE_DECODE_AT: usize = MOE_COMBINE_AT + DTYPES;
const A2AV_FUSED_AT: usize = MOE_DECODE_AT + DTYPES;
const A2AV_LINES_AT: usize = A2AV_FUSED_AT + KINDS;
const MOVE_AT: usize = A2AV_LINES_AT + KINDS;
const REDUCE_AT: usize = MOVE_AT + Movement::ALL.len() * PROTOCOLS.len();

impl KernelId {
    /// Entries of the table [`KernelId::index`] numbers (some numbers name
    /// no kernel: a reduction the type lacks, a size its family is not
    /// built for).
    pub(crate) const COUNT: usize = REDUCE_AT + ReduceKernel::ALL.len() * DTYPES * OPS * TeamSize::ALL.len();

    /// Reduction `kernel` of `dtype` and `op` for a team of `n_pes`: the
    /// family's build for the team's size where it has one
    /// ([`TeamSize::of`]).
    pub(crate) fn reduce(kernel: ReduceKernel, dtype: DType, op: ReduceOp, n_pes: usize) -> KernelId {
        let size = if kernel.sized() { TeamSize::of(op, n_pes) } else { TeamSize::Any };
        KernelId::Reduce(kernel, dtype, op, size)
    }

    /// This kernel's place in the table of loaded functions, below
    /// [`KernelId::COUNT`]; no two kernels share one.
    pub(crate) fn index(self) -> usize {
        let dtype = |d: DType| d as usize - DType::F32 as usize;
        let op = |o: ReduceOp| o as usize - ReduceOp::Sum as usize;
        match self {
            KernelId::Plain(p) => p as usize,
            KernelId::SumSlots(d) => SUM_SLOTS_AT + dtype(d),
            KernelId::MoeCombine(d) => MOE_COMBINE_AT + dtype(d),
            KernelId::MoeDecode(d) => MOE_DECODE_AT + dtype(d),
            KernelId::A2avFused(k) => A2AV_FUSED_AT + k as usize,
            KernelId::A2avLines(k) => A2AV_LINES_AT + k as usize,
            KernelId::Move(m, p) => MOVE_AT + m as usize * PROTOCOLS.len() + p as usize,
            KernelId::Reduce(r, d, o, s) => {
                REDUCE_AT + ((r as usize * DTYPES + dtype(d)) * OPS + op(o)) * TeamSize::ALL.len() + s as usize
            }
        }
    }

    /// The kernel's C symbol in the cubin.
    pub(crate) fn symbol(self) -> String {
        let a2av = |k: A2avKind| match k {
            A2avKind::V => "v",
            A2avKind::TwoD => "2d",
            A2avKind::TwoDOffset => "2d_offset",
        };
        match self {
            KernelId::Plain(p) => p.symbol().into(),
            KernelId::SumSlots(d) => format!("shmem_sum_slots_{}", d.name()),
            KernelId::MoeCombine(d) => format!("shmem_moe_combine_{}", d.name()),
            KernelId::MoeDecode(d) => format!("shmem_moe_decode_{}", d.name()),
            KernelId::A2avFused(k) => format!("shmem_a2av_fused_{}", a2av(k)),
            KernelId::A2avLines(k) => format!("shmem_a2av_lines_{}", a2av(k)),
            KernelId::Move(m, p) => format!("{}{}", m.symbol(), protocol_suffix(p)),
            KernelId::Reduce(r, d, o, s) if r.sized() => {
                format!("{}_{}_{}_{}", r.symbol(), d.name(), o.name(), s.pes())
            }
            KernelId::Reduce(r, d, o, _) => format!("{}_{}_{}", r.symbol(), d.name(), o.name()),
        }
    }

    /// Whether the kernel is launched by programmatic dependent launch
    /// (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`): its launch
    /// overlaps the end of the kernel before it on the stream, which it
    /// waits for as its first step (`follow_stream` in `core/team_sync.cuh`),
    /// which shortens the gap between kernels (`docs/tuning.md`). Every kernel
    /// this says so of must begin with that wait: the collectives, the MoE
    /// all-to-all-v and `MoeAllToAll`'s route, gather and combine kernels;
    /// not the local kernels outside them.
    pub(crate) fn follows_stream(self) -> bool {
        !matches!(self, KernelId::Plain(Plain::SelfCheck | Plain::CopySm | Plain::Amo) | KernelId::SumSlots(_))
    }

    /// Every kernel the cubin defines.
    #[cfg(test)]
    pub(crate) fn all() -> Vec<KernelId> {
        let mut all: Vec<KernelId> = Plain::ALL.iter().map(|&p| KernelId::Plain(p)).collect();
        all.extend([DType::F32, DType::F16, DType::BF16].map(KernelId::SumSlots));
        all.extend([DType::F32, DType::F64, DType::F16, DType::BF16].map(KernelId::MoeCombine));
        all.extend([DType::F32, DType::F64, DType::F16, DType::BF16].map(KernelId::MoeDecode));
        all.extend(A2avKind::ALL.map(KernelId::A2avFused));
        all.extend(A2avKind::ALL.map(KernelId::A2avLines));
        for m in Movement::ALL {
            all.extend(PROTOCOLS.map(|p| KernelId::Move(m, p)));
        }
        for r in ReduceKernel::ALL {
            for d in DType::ALL {
                for o in ReduceOp::ALL.into_iter().filter(|o| o.supports(d)) {
                    let sizes = match (r.sized(), o) {
                        (false, _) => vec![TeamSize::Any],
                        (true, ReduceOp::Sum) if r == ReduceKernel::AllReduceTwoShotStores => {
                            vec![TeamSize::Any, TeamSize::Two]
                        }
                        (true, ReduceOp::Sum) => TeamSize::ALL.to_vec(),
                        (true, _) => vec![TeamSize::Any],
                    };
                    all.extend(sizes.into_iter().map(|s| KernelId::Reduce(r, d, o, s)));
                }
            }
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every combination of the enums, valid or not.
    fn every_combination() -> Vec<KernelId> {
        let mut all: Vec<KernelId> = Plain::ALL.iter().map(|&p| KernelId::Plain(p)).collect();
        all.extend(DType::ALL.map(KernelId::SumSlots));
        all.extend(DType::ALL.map(KernelId::MoeCombine));
        all.extend(DType::ALL.map(KernelId::MoeDecode));
        all.extend(A2avKind::ALL.map(KernelId::A2avFused));
        all.extend(A2avKind::ALL.map(KernelId::A2avLines));
        for m in Movement::ALL {
            all.extend(PROTOCOLS.map(|p| KernelId::Move(m, p)));
        }
        for r in ReduceKernel::ALL {
            for d in DType::ALL {
                for o in ReduceOp::ALL {
                    all.extend(TeamSize::ALL.map(|s| KernelId::Reduce(r, d, o, s)));
                }
            }
        }
        all
    }

    #[test]
    fn indices_number_the_table_densely() {
        let all = every_combination();
        assert_eq!(all.len(), KernelId::COUNT);
        let mut seen = vec![false; KernelId::COUNT];
        for id in all {
            let i = id.index();
            assert!(i < KernelId::COUNT, "{id:?} at {i}");
            assert!(!seen[i], "{id:?} shares index {i}");
            seen[i] = true;
        }
    }

    #[test]
    fn symbols_are_spelled_as_the_kernels_define_them() {
        let r = |k, d, o, s| KernelId::Reduce(k, d, o, s).symbol();
        use ReduceKernel::*;
        assert_eq!(r(AllReduceLowLatency, DType::BF16, ReduceOp::Sum, TeamSize::Any), "shmem_allreduce_ll_bf16_sum");
        assert_eq!(
            r(AllReduceLowLatency128, DType::F32, ReduceOp::Max, TeamSize::Any),
            "shmem_allreduce_ll128_f32_max"
        );
        assert_eq!(
            r(AllReduceOneShot, DType::F32, ReduceOp::Sum, TeamSize::Eight),
            "shmem_allreduce_oneshot_f32_sum_8"
        );
        assert_eq!(
            r(AllReduceTwoShotStores, DType::U64, ReduceOp::Xor, TeamSize::Any),
            "shmem_allreduce_twoshot2_u64_xor_0"
        );
        assert_eq!(
            r(ReduceScatterLowLatency128, DType::F16, ReduceOp::Min, TeamSize::Any),
            "shmem_reducescatter_ll128_f16_min"
        );
        assert_eq!(
            r(ReduceScatterPush, DType::I32, ReduceOp::Sum, TeamSize::Two),
            "shmem_reducescatter_push_i32_sum_2"
        );
        assert_eq!(KernelId::Move(Movement::AllToAll, Protocol::Sm).symbol(), "shmem_alltoall");
        assert_eq!(KernelId::Move(Movement::Broadcast, Protocol::LowLatency128).symbol(), "shmem_broadcast_ll128");
        assert_eq!(KernelId::Move(Movement::AllGather, Protocol::Push).symbol(), "shmem_allgather_push");
        assert_eq!(KernelId::A2avFused(A2avKind::TwoDOffset).symbol(), "shmem_a2av_fused_2d_offset");
        assert_eq!(KernelId::A2avLines(A2avKind::V).symbol(), "shmem_a2av_lines_v");
        assert_eq!(KernelId::MoeCombine(DType::BF16).symbol(), "shmem_moe_combine_bf16");
        assert_eq!(KernelId::SumSlots(DType::F16).symbol(), "shmem_sum_slots_f16");
        assert_eq!(r(AllReduceNodes, DType::BF16, ReduceOp::Sum, TeamSize::Any), "shmem_allreduce_nodes_bf16_sum");
        assert_eq!(
            r(ReduceScatterNodes, DType::U32, ReduceOp::Xor, TeamSize::Any),
            "shmem_reducescatter_nodes_u32_xor"
        );
        assert_eq!(r(AllReduceGrouped, DType::F16, ReduceOp::Max, TeamSize::Any), "shmem_allreduce_grouped_f16_max");
        assert_eq!(
            r(ReduceScatterGrouped, DType::I64, ReduceOp::Sum, TeamSize::Any),
            "shmem_reducescatter_grouped_i64_sum"
        );
        assert_eq!(KernelId::Plain(Plain::AllGatherNodes).symbol(), "shmem_allgather_nodes");
        assert_eq!(KernelId::Plain(Plain::BroadcastNodes).symbol(), "shmem_broadcast_nodes");
        assert_eq!(KernelId::Plain(Plain::AllToAllNodes).symbol(), "shmem_alltoall_nodes");
    }

    #[test]
    fn sums_over_2_4_and_8_pes_have_their_own_kernels() {
        assert_eq!(TeamSize::of(ReduceOp::Sum, 2), TeamSize::Two);
        assert_eq!(TeamSize::of(ReduceOp::Sum, 4), TeamSize::Four);
        assert_eq!(TeamSize::of(ReduceOp::Sum, 8), TeamSize::Eight);
        for n in [1, 3, 5, 6, 7, 16, 64] {
            assert_eq!(TeamSize::of(ReduceOp::Sum, n), TeamSize::Any);
        }
        for op in &ReduceOp::ALL[1..] {
            assert_eq!(TeamSize::of(*op, 2), TeamSize::Any);
        }
    }

    /// A kernel defined in `kernels/`: its name, where a macro builds it
    /// the literal pieces between the macro's parameters (`None`), whether
    /// its body begins with `follow_stream()`, and its file.
    struct Defined {
        name: Vec<Option<String>>,
        follows: bool,
        path: String,
    }

    impl Defined {
        /// Whether this definition makes `symbol`: its literal pieces in
        /// order, a parameter standing for any text.
        fn makes(&self, symbol: &str) -> bool {
            let mut rest = symbol;
            let mut anchored = true;
            for piece in &self.name {
                match piece {
                    None => anchored = false,
                    Some(lit) if anchored => match rest.strip_prefix(lit.as_str()) {
                        Some(r) => rest = r,
                        None => return false,
                    },
                    Some(lit) => match rest.find(lit.as_str()) {
                        Some(i) => {
                            rest = &rest[i + lit.len()..];
                            anchored = true;
                        }
                        None => return false,
                    },
                }
            }
            if anchored {
                return rest.is_empty();
            }
            // Ends in a parameter, or its last literal must end the symbol.
            match self.name.last() {
                Some(Some(lit)) => symbol.ends_with(lit.as_str()),
                _ => true,
            }
        }
    }

    /// Every `__global__` function of `kernels/`: the name after its
    /// `void` (and `__launch_bounds__(…)`), pieces joined by `##` with
    /// the macro's parameters among them, and its body's first statement.
    fn defined_kernels() -> Vec<Defined> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels");
        let mut found = Vec::new();
        let mut files = Vec::new();
        let mut folders = vec![dir];
        while let Some(folder) = folders.pop() {
            for entry in std::fs::read_dir(&folder).expect("kernels/ is beside the crate") {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    folders.push(path);
                } else {
                    files.push(path);
                }
            }
        }
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap().replace('\\', " ");
            for (at, _) in text.match_indices("__global__") {
                let rest = text[at + "__global__".len()..].trim_start();
                let rest = rest.strip_prefix("void").expect("a kernel returns void").trim_start();
                let rest = match rest.strip_prefix("__launch_bounds__") {
                    Some(r) => r[r.find(')').unwrap() + 1..].trim_start(),
                    None => rest,
                };
                let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '#')).unwrap();
                let name = rest[..end]
                    .split("##")
                    .map(|p| (p.starts_with("shmem_") || p.starts_with('_')).then(|| p.to_owned()))
                    .collect();
                let body = &rest[rest.find('{').unwrap() + 1..];
                let first = body.split(';').next().unwrap();
                let follows = first.split_whitespace().collect::<String>() == "shmem::k::follow_stream()";
                found.push(Defined { name, follows, path: path.display().to_string() });
            }
        }
        found
    }

    #[test]
    fn kernel_names_are_read_from_the_sources() {
        let defined = defined_kernels();
        let makers = |symbol: &str| defined.iter().filter(|d| d.makes(symbol)).count();
        assert_eq!(makers("shmem_barrier"), 1);
        assert_eq!(makers("shmem_allreduce_oneshot_f32_sum_2"), 1);
        assert_eq!(makers("shmem_a2av_lines_2d_offset"), 1);
        assert_eq!(makers("shmem_a2av_lines_2d"), 1);
        assert_eq!(makers("shmem_moe_combine_bf16"), 1);
        assert_eq!(makers("shmem_allreduce_nodes_f32_sum"), 1);
        assert_eq!(makers("shmem_allreduce_grouped_bf16_sum"), 1);
        assert_eq!(makers("shmem_broadcast_nodes"), 1);
        assert_eq!(makers("shmem_alltoall_nodes"), 1);
        assert_eq!(makers("shmem_nothing"), 0);
    }

    /// Every kernel launched by programmatic dependent launch waits for
    /// the kernel before it as its first step: one that did not would read
    /// its inputs while that kernel still runs. Every such kernel is
    /// checked (its definition found among the sources).
    #[test]
    fn dependent_launches_wait_first() {
        let defined = defined_kernels();
        for id in KernelId::all().into_iter().filter(|id| id.follows_stream()) {
            let symbol = id.symbol();
            let defs: Vec<_> = defined.iter().filter(|d| d.makes(&symbol)).collect();
            assert!(!defs.is_empty(), "{symbol} (launched by dependent launch) is defined nowhere in kernels/");
            for d in defs {
                assert!(
                    d.follows,
                    "{}: kernel {symbol} is launched by dependent launch but does not begin with follow_stream()",
                    d.path
                );
            }
        }
    }

    /// The cubin defines every kernel (where this build has one and it is a
    /// single architecture's image, whose string table holds the names).
    #[test]
    fn the_cubin_defines_every_kernel() {
        let Some(cubin) = super::super::module::CUBIN else { return };
        if !cubin.starts_with(b"\x7fELF") {
            return;
        }
        let names: std::collections::HashSet<&[u8]> = cubin.split(|&b| b == 0).collect();
        for id in KernelId::all() {
            assert!(names.contains(id.symbol().as_bytes()), "the cubin has no kernel {}", id.symbol());
        }
    }
}
