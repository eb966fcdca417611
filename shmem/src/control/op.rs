//! The kinds of call the PEs agree on: the first word of a descriptor row
//! names one.

/// What a descriptor describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum OpKind {
    Barrier = 1,
    Broadcast,
    AllGather,
    AllReduce,
    ReduceScatter,
    AllToAll,
    Alloc,
    Split,
    SplitBases,
    AllToAllV,
    AllToAllV2d,
    AllToAllV2dOffset,
    MoeSetup,
    AllGatherMatmul,
    MatmulReduceScatter,
    MoeDispatch,
    MoeCombine,
}

impl OpKind {
    pub(crate) fn from_u8(v: u8) -> Option<OpKind> {
        use OpKind::*;
        [
            Barrier,
            Broadcast,
            AllGather,
            AllReduce,
            ReduceScatter,
            AllToAll,
            Alloc,
            Split,
            SplitBases,
            AllToAllV,
            AllToAllV2d,
            AllToAllV2dOffset,
            MoeSetup,
            AllGatherMatmul,
            MatmulReduceScatter,
            MoeDispatch,
            MoeCombine,
        ]
        .into_iter()
        .find(|k| *k as u8 == v)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            OpKind::Barrier => "barrier",
            OpKind::Broadcast => "broadcast",
            OpKind::AllGather => "all_gather",
            OpKind::AllReduce => "all_reduce",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::AllToAll => "all_to_all",
            OpKind::Alloc => "alloc",
            OpKind::Split => "split_strided",
            OpKind::SplitBases => "split_strided",
            OpKind::AllToAllV => "all_to_all_v",
            OpKind::AllToAllV2d => "all_to_all_v_2d",
            OpKind::AllToAllV2dOffset => "all_to_all_v_2d_offset",
            OpKind::MoeSetup => "MoeAllToAll::new",
            OpKind::AllGatherMatmul => "all_gather_matmul",
            OpKind::MatmulReduceScatter => "matmul_reduce_scatter",
            OpKind::MoeDispatch => "MoeAllToAll::dispatch",
            OpKind::MoeCombine => "MoeAllToAll::combine",
        }
    }
}
